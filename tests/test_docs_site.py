"""The documentation site builds without a warning, its reference lists
every public name, and every Python example in it (and in the README) runs
against the real library: cluster examples against a real 3-member etcd."""
import os
import posixpath
import subprocess
import sys

import pytest
from browser import find_browser, layout_report
from docs_examples import (
    DIRECTIVES,
    ROOT,
    SHOWN,
    blocks,
    leftovers,
    new_prefix,
    python_blocks,
    unique,
)

import pyshmlock

MODULES = ["pyshmlock", "pyshmlock.aio", "pyshmlock.cluster", "pyshmlock.integrations",
           "pyshmlock.integrations.sglang"]


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The site, built once with warnings as errors: (returncode, output, dir)."""
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-b", "html",
                           "-q", os.path.join(ROOT, "docs"), str(out)],
                          capture_output=True, text=True, timeout=280, cwd=str(out))
    return done.returncode, done.stdout + done.stderr, out


@pytest.mark.timeout(300)
def test_site_builds_without_a_warning(site):
    rc, output, out = site
    assert rc == 0 and "WARNING" not in output, output[-6000:]
    for page in ("index", "quickstart", "concepts", "asyncio", "sglang", "cluster",
                 "OPERATIONS", "benchmarks", "DESIGN", "verification", "layout", "api",
                 "changelog"):
        assert (out / f"{page}.html").is_file(), page


@pytest.mark.timeout(300)
def test_reference_lists_every_public_name(site):
    from sphinx.util.inventory import InventoryFile
    rc, output, out = site
    assert rc == 0, output[-6000:]
    with open(out / "objects.inv", "rb") as f:
        inv = InventoryFile.load(f, "", posixpath.join)
    documented = {name for kind, entries in inv.items() if kind.startswith("py:")
                  for name in entries}
    missing = []
    for modname in MODULES:
        module = __import__(modname, fromlist=["__all__"])
        assert module.__all__, f"{modname} declares no public names"
        assert modname in documented, modname
        missing += [f"{modname}.{n}" for n in module.__all__
                    if f"{modname}.{n}" not in documented]
    assert not missing, f"not in the API reference: {missing}"


@pytest.mark.timeout(300)
def test_operations_page_shows_the_alert_rules(site):
    rc, output, out = site
    assert rc == 0, output[-6000:]
    html = (out / "OPERATIONS.html").read_text()
    with open(os.path.join(ROOT, "docs", "prometheus", "alerts.yml")) as f:
        first_alert = next(ln for ln in f if "alert:" in ln).split("alert:")[1].strip()
    assert first_alert in html


MAIN_PAGES = ("index", "quickstart", "asyncio", "cluster", "sglang", "benchmarks")
WINDOW = 1280       # px: a laptop's browser window


@pytest.fixture(scope="module")
def layouts(site):
    """Each main page laid out by a headless Chromium at WINDOW px."""
    rc, output, out = site
    assert rc == 0, output[-6000:]
    browser = find_browser()
    if browser is None:
        pytest.skip("no headless browser: Chromium is not installed "
                    "(Debian: apt-get install chromium; .ci/run installs it)")
    return {page: layout_report(browser, str(out / f"{page}.html"), width=WINDOW)
            for page in MAIN_PAGES}


@pytest.mark.timeout(400)
def test_main_pages_show_code_and_tables_whole_at_1280_px(layouts):
    """No code block or table needs a scroll bar, is cut by a box around it,
    or runs past the window (the site's column fits a 100-character line)."""
    assert all(r["width"] == WINDOW for r in layouts.values()), \
        {p: r["width"] for p, r in layouts.items()}
    assert sum(r["checked"] for r in layouts.values()) >= 20, layouts
    clipped = {p: r["clipped"] for p, r in layouts.items() if r["clipped"]}
    assert not clipped, clipped


@pytest.mark.timeout(400)
def test_benchmark_chart_is_legible_on_the_page_and_linked_at_full_size(site, layouts):
    from pyshmlock_lab.bench.report import CHART_DPI, CHART_FONT_PT
    rc, output, out = site
    html = (out / "benchmarks.html").read_text()
    assert '<a class="reference internal image-reference" href="_images/bench.png">' in html
    (chart,) = [i for i in layouts["benchmarks"]["images"] if i["src"].endswith("bench.png")]
    text_px = CHART_FONT_PT / 72 * CHART_DPI * chart["shown"] / chart["natural"]
    assert text_px >= 13, f"the chart's text is {text_px:.1f} px tall on the page: {chart}"


def test_every_fenced_block_runs_or_is_marked_as_shown():
    """A block that cannot run standalone is fenced console/text/bash, so that
    every `python` block is one the suite runs."""
    for b in blocks():
        assert b.lang in SHOWN | DIRECTIVES | {"python"}, \
            f"{b.id}: fence '{b.lang}': python (runs), or one of {sorted(SHOWN)}"


def test_examples_use_only_names_the_runner_makes_unique():
    for b in python_blocks():
        opens = any(call in b.code for call in ("RWLock(", "Cluster(", "unlink("))
        if opens:
            assert unique(b.code, "x-") != b.code, \
                f"{b.id}: name its lock model-weights, sglang-<port> or rl-fleet"


DEFAULT = [b for b in python_blocks() if not b.needs_sglang]


def run_example(block, tmp_path, env=None, timeout=60):
    prefix = new_prefix()
    script = tmp_path / "example.py"
    script.write_text(unique(block.code, prefix))
    environ = dict(os.environ, PYSHMLOCK_CLUSTER_DIR=str(tmp_path / "cluster.d"),
                   **(env or {}))
    try:
        done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                              timeout=timeout, cwd=str(tmp_path), env=environ)
    finally:
        left = leftovers(prefix)
        for name in left:
            pyshmlock.unlink(name, force=True)
    assert done.returncode == 0, f"{block.id} failed:\n{done.stdout[-3000:]}{done.stderr[-5000:]}"
    assert not left, f"{block.id} left {left} in /dev/shm"
    return done


@pytest.mark.timeout(120)
@pytest.mark.parametrize("block", [b for b in DEFAULT if not b.needs_etcd],
                         ids=lambda b: b.id)
def test_example_runs(block, tmp_path):
    run_example(block, tmp_path)


@pytest.fixture(scope="module")
def etcd():
    from pyshmlock_lab.cluster.localetcd import LocalEtcd, etcd_binary
    if etcd_binary() is None:
        if os.environ.get("PYSHMLOCK_REQUIRE_ETCD") == "1":
            raise RuntimeError("PYSHMLOCK_REQUIRE_ETCD=1 but etcd is not installed")
        pytest.skip("etcd is not installed (Debian: apt-get install etcd-server)")
    e = LocalEtcd(members=3)
    try:
        yield e
    finally:
        e.stop()
        assert not os.path.exists(e.dir)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("block", [b for b in DEFAULT if b.needs_etcd], ids=lambda b: b.id)
def test_cluster_example_runs_against_a_real_etcd(block, tmp_path, etcd):
    run_example(block, tmp_path, env={"PYSHMLOCK_ETCD": ",".join(etcd.endpoints)},
                timeout=180)


def test_the_sglang_example_is_run_by_the_real_sglang_suite():
    sglang = [b for b in python_blocks() if b.needs_sglang]
    assert sglang, "the SGLang example (install()) is missing"
    with open(os.path.join(ROOT, "tests", "sglang_server", "test_docs_example.py")) as f:
        assert "needs_sglang" in f.read()
