"""The README stays a short landing page whose set-up commands are the ones
CI and the package really use, and the figures and constants the documents
quote are read from the code, not copied by hand."""
import importlib.util
import inspect
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read(*path):
    with open(os.path.join(ROOT, *path)) as f:
        return f.read()


def _mutants():
    return _verify_run().MUTANTS


def _forever_years():
    """The timeout ceiling of the fast path (csrc/fastpath/fastpath.h): any
    wait this long or longer waits forever."""
    m = re.search(r"#define FOREVER_S \(\(double\)\(1LL << (\d+)\) / 1e9\)",
                  read("csrc", "fastpath", "fastpath.h"))
    assert m, "FOREVER_S moved: update this test"
    return int(2 ** int(m.group(1)) / 1e9 / (365.25 * 86400))


def _layout():
    import pyshmlock._shmlock as core
    return core.lib.SHL_LAYOUT_VERSION


def _version():
    return re.search(r'^version = "([^"]+)"', read("pyproject.toml"), re.M).group(1)


def _init_default(cls, param):
    return inspect.signature(cls.__init__).parameters[param].default


def _rwlock_default(param):
    import pyshmlock
    return _init_default(pyshmlock.RWLock, param)


def _default_max_processes():
    from pyshmlock.lock import DEFAULT_MAX_PROCESSES
    return DEFAULT_MAX_PROCESSES


def _cluster(name):
    import pyshmlock.cluster
    return getattr(pyshmlock.cluster, name)


def _agent_fraction():
    from pyshmlock.cluster import agent
    return agent.LOCAL_FRACTION


def _keeper_capacity():
    m = re.search(r"#define KEEPER_CAPACITY (\d+)", read("csrc", "core", "process.c"))
    return int(m.group(1))


def _num(x):
    """A figure as the documents print it: 600.0 -> '600', 7.5 -> '7.5'."""
    return f"{x:g}"


# (document, regex whose group 1 is the quoted value, the value from the code)
FACTS = [
    ("docs/quickstart.md", r"Any timeout of (\d+) years or more", lambda: str(_forever_years())),
    ("docs/quickstart.md", r"RWLock\(name, \*, create=True, mode=0o(\d+),",
     lambda: f"{_rwlock_default('mode'):o}"),
    ("docs/quickstart.md", r"RWLock\(name, .*?max_processes=(\w+),",
     lambda: str(_rwlock_default("max_processes"))),
    ("docs/quickstart.md", r"`max_processes` \(None: (\d+) for a new lock",
     lambda: str(_default_max_processes())),
    ("docs/quickstart.md", r"RWLock\(name, .*?stale=\"(\w+)\"\)",
     lambda: _rwlock_default("stale")),
    ("docs/quickstart.md", r"name is 1-(\d+) chars",
     lambda: re.search(r"\{1,(\d+)\}", read("pyshmlock", "_args.py")).group(1)),
    ("docs/quickstart.md", r"begin_session\(ttl=(\d+)",
     lambda: _num(__import__("pyshmlock").DEFAULT_SESSION_TTL)),
    ("docs/concepts.md", r"begin_session\(ttl=(\d+), timeout=None\)",
     lambda: _num(__import__("pyshmlock").DEFAULT_SESSION_TTL)),
    ("docs/concepts.md", r"`pyshmlock\.DEFAULT_SESSION_TTL`, (\d+) s",
     lambda: _num(__import__("pyshmlock").DEFAULT_SESSION_TTL)),
    ("docs/concepts.md", r"`pyshmlock\.MAX_SESSION_TTL`, (\d+) days",
     lambda: _num(__import__("pyshmlock").MAX_SESSION_TTL / 86400)),
    ("docs/OPERATIONS.md", r"at most (\d+) days \(`pyshmlock\.MAX_SESSION_TTL`",
     lambda: _num(__import__("pyshmlock").MAX_SESSION_TTL / 86400)),
    ("docs/asyncio.md", r"begin_session\(ttl=(\d+)",
     lambda: _num(__import__("pyshmlock").DEFAULT_SESSION_TTL)),
    ("docs/concepts.md", r"one keeper thread\nper ([\d,]+) locks",
     lambda: f"{_keeper_capacity():,}"),
    ("docs/cluster.md", r"`pyshmlock\.cluster\.DEFAULT_TTL`, (\d+) s",
     lambda: _num(_cluster("DEFAULT_TTL"))),
    ("docs/cluster.md", r"\(([\d.]+) s at the default \d+ s",
     lambda: _num(_agent_fraction() * _cluster("DEFAULT_TTL"))),
    ("docs/cluster.md", r"([\d.]+) s at the default (?:\d+) s",
     lambda: _num(_agent_fraction() * _cluster("DEFAULT_TTL"))),
    ("docs/cluster.md", r"lease of\n(\d+) s \(`pyshmlock\.cluster\.DEFAULT_UPDATE_TTL`",
     lambda: _num(_cluster("DEFAULT_UPDATE_TTL"))),
    ("docs/OPERATIONS.md", r"--ttl`, default (\d+) s\)", lambda: _num(_cluster("DEFAULT_TTL"))),
    ("docs/OPERATIONS.md", r"lease of\n(\d+) s \(`Cluster\(ttl=",
     lambda: _num(_cluster("DEFAULT_UPDATE_TTL"))),
    ("docs/sglang.md", r"`(X-[A-Za-z-]+)`", lambda: _cluster("FENCE_HEADER")),
    ("docs/cluster.md", r"`(X-[A-Za-z-]+)` header", lambda: _cluster("FENCE_HEADER")),
    ("docs/asyncio.md", r"matches SGLang ([\d.]+)'s",
     lambda: __import__("pyshmlock.integrations.sglang",
                        fromlist=["x"]).TESTED_VERSIONS[-1]),
    ("README.md", r"In SGLang ([\d.]+), without editing",
     lambda: __import__("pyshmlock.integrations.sglang",
                        fromlist=["x"]).TESTED_VERSIONS[-1]),
    ("CHANGELOG.md", r"^\| {version} \| (\d+) \|", lambda: str(_layout())),
    ("CHANGELOG.md", r"layout\nversion \(`(SHL_LAYOUT)` in the C core\)", lambda: "SHL_LAYOUT"),
]


@pytest.mark.parametrize("doc,pattern,value", FACTS,
                         ids=[f"{d}:{p[:30]}" for d, p, _ in FACTS])
def test_documented_constants_are_the_codes(doc, pattern, value):
    pattern = pattern.replace("{version}", re.escape(_version()))
    found = re.findall(pattern, read(doc), re.M | re.S)
    assert found, f"{doc} no longer says {pattern!r}: update the document or this table"
    expected = value()
    assert all(v == expected for v in found), f"{doc}: {found} where the code says {expected}"


def test_documented_timeout_ceiling_is_the_codes():
    """The forever rule is quoted in the quickstart and in the lock's docstring."""
    years = _forever_years()
    assert f"Any timeout of {years} years or more" in read("docs", "quickstart.md")
    assert f"{years} years" in read("pyshmlock", "lock.py")


def test_documented_layout_version_is_the_cores():
    assert re.search(rf"#define SHL_LAYOUT_VERSION {_layout()}\b", read("csrc", "shmlock.h"))
    from pyshmlock.errors import LAYOUT_RELEASES
    assert LAYOUT_RELEASES[_layout()] == ".".join(_version().split(".")[:2]) + ".x"


def test_no_document_quotes_a_stale_mutant_count():
    """The verification page derives the count (docs/conf.py); any count
    written out elsewhere must be the model check's."""
    n = len(_mutants())
    words = {"twelve": 12, "thirteen": 13, "fourteen": 14, "fifteen": 15, "sixteen": 16,
             "twenty": 20}
    for doc in ["README.md", "CHANGELOG.md"] + [f"docs/{f}" for f in os.listdir(
            os.path.join(ROOT, "docs")) if f.endswith(".md")]:
        for count in re.findall(r"\b(\w+)\s+(?:injected protocol bugs|mutants)\b", read(doc),
                                re.I):
            value = words.get(count.lower(), int(count) if count.isdigit() else None)
            assert value in (None, n), f"{doc} says {count} mutants; verify/run.py has {n}"
    assert "{{ mutant_count }}" in read("docs", "verification.md")
    assert "len(MUTANTS)" in read("docs", "conf.py")


def test_operations_lists_every_exported_series():
    from pyshmlock.metrics import METRICS
    ops = read("docs", "OPERATIONS.md")
    for m in METRICS:
        series = m.name + "_total" if m.kind == "counter" else m.name
        assert f"`{series}" in ops, f"OPERATIONS.md's Prometheus table misses {series}"


def test_readme_is_a_landing_page():
    text = read("README.md")
    lines = text.count("\n")
    assert lines <= 200, f"README.md has {lines} lines: the site is the place for detail"
    headings = re.findall(r"^## .+$", text, re.M)
    assert len(headings) == len(set(headings)) >= 5, headings
    for target in re.findall(r"\]\(((?:docs/)?[\w./-]+\.md)(?:#[\w-]+)?\)", text):
        assert os.path.isfile(os.path.join(ROOT, target)), f"README links to missing {target}"


def test_readme_commands_are_the_real_ones():
    readme = read("README.md")
    ci = read(".ci/run").splitlines()
    test_cmd = ci[ci.index("# --- the README's test command, verbatim ---") + 1]
    assert test_cmd in readme
    assert "pip install '.[demo]' && pyshmlock demo" in readme
    assert 'pyshmlock = "pyshmlock.cli:main"' in read("pyproject.toml")


def test_readme_demo_line_names_the_backend_it_runs():
    from pyshmlock import cli
    parser = cli.build_parser()
    subs = next(a for a in parser._actions if isinstance(a.choices, dict))
    backend = next(a for a in subs.choices["demo"]._actions if a.dest == "backend")
    readme = read("README.md")
    assert f"(the `{backend.default}` backend, the default)" in readme
    other = [c for c in backend.choices if c != backend.default]
    assert other and all(f"`pyshmlock demo --backend {c}`" in readme for c in other)


def test_docs_extra_pins_the_site_builders_in_the_test_extra_too():
    """CI installs only .[test], and the suite builds the site."""
    text = read("pyproject.toml")
    docs = re.search(r"^docs = \[(.*?)\]", text, re.M | re.S).group(1)
    test = re.search(r"^test = \[(.*?)\]", text, re.M | re.S).group(1)
    pins = re.findall(r'"((?:sphinx|myst-parser|furo)==[^"]+)"', docs)
    assert len(pins) == 5, pins
    for pin in pins:
        assert f'"{pin}"' in test, f"the test extra misses {pin}"


def test_sglang_extra_admits_exactly_the_tested_releases():
    """pyshmlock[sglang] installs only an SGLang release install() accepts:
    each of TESTED_VERSIONS, not the one before, the next, or a post-release
    (install() refuses a version not in the list)."""
    from packaging.requirements import Requirement
    from packaging.version import Version

    from pyshmlock.integrations.sglang import TESTED_VERSIONS
    extra = re.search(r"^sglang = \[(.*?)\]", read("pyproject.toml"), re.M | re.S).group(1)
    (req,) = [Requirement(r) for r in re.findall(r'"([^"]+)"', extra)]
    assert req.name == "sglang"
    for v in TESTED_VERSIONS:
        assert req.specifier.contains(v), (str(req), v)
    first, last = Version(TESTED_VERSIONS[0]), Version(TESTED_VERSIONS[-1])
    for outside in (f"{first.major}.{first.minor}.{first.micro - 1}",
                    f"{last.major}.{last.minor}.{last.micro + 1}", f"{last}.post1",
                    f"{last.major}.{last.minor + 1}.0"):
        assert not req.specifier.contains(outside), (str(req), outside)


def test_operations_page_exists_and_is_linked():
    ops = read("docs", "OPERATIONS.md")
    for topic in ("Choosing timeouts", "Data suspect", "A pause left on", "exits 3",
                  "A stale segment after a restart", "What to alert on", "Prometheus"):
        assert topic.lower() in ops.lower(), topic
    assert "docs/OPERATIONS.md" in read("README.md")


def test_sglang_snippets_name_their_stale_policy():
    for doc in ("README.md", "docs/asyncio.md"):
        lines = [ln for ln in read(doc).splitlines() if "AsyncRWLock(" in ln and "sglang-" in ln]
        assert lines, doc
        assert all('stale="reset"' in ln for ln in lines), (doc, lines)


def test_observers_are_documented_as_they_are():
    """Observers read copies with pread() and never map the segment."""
    info_c = read("csrc", "core", "info.c")
    assert "never maps the segment" in info_c and "pread(" in info_c
    for doc in ("docs/OPERATIONS.md", "docs/DESIGN.md", "docs/quickstart.md"):
        text = read(doc)
        assert "never map" in text, doc
        assert not re.search(r"map(?:s)? the segment read-only", text), doc


def test_design_names_the_registry_and_helpers_locks_where_they_live():
    design = read("docs", "DESIGN.md")
    for qualified in re.findall(r"`(_[a-z]+)\.(_[a-z_]+_lock)`", design):
        module, name = qualified
        assert re.search(rf"^{name} = threading\.R?Lock\(\)",
                         read("pyshmlock", module + ".py"), re.M), \
            f"DESIGN names {module}.{name}, which is not there"


def _verify_run():
    spec = importlib.util.spec_from_file_location("_verify_run",
                                                  os.path.join(ROOT, "verify", "run.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


NUMBER_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine",
                "ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen",
                "seventeen", "eighteen", "nineteen", "twenty"]


def test_documented_quick_model_check_is_what_verify_quick_runs():
    """DESIGN §9 says which configurations and mutants `make verify-quick`
    runs: the ones verify/run.py marks quick."""
    run = _verify_run()
    m = re.search(r"`make verify-quick` runs the first (\w+) configurations.*?and every "
                  r"mutant but (.*?) in about a", read("docs", "DESIGN.md"), re.S)
    assert m, "DESIGN no longer says what make verify-quick runs"
    quick = [c.quick for c in run.CONFIGS]
    first = quick.index(False) if False in quick else len(quick)
    assert all(not q for q in quick[first:]), "the quick configurations are not the first ones"
    assert m.group(1) == NUMBER_WORDS[first], f"DESIGN says {m.group(1)}; run.py: {first}"
    named = set(re.findall(r"`([A-Z_]+)`", m.group(2)))
    assert named == {n for n, mu in run.MUTANTS.items() if not mu.quick}, named


def test_design_lists_every_mutant_the_model_check_runs():
    """DESIGN §9's mutant table says, for each mutant, the configuration that
    exposes it and what catches it: none may be missing from it."""
    design = read("docs", "DESIGN.md")
    table = design[design.index("**Mutants.**"):design.index("**Limits of the check.**")]
    listed = set(re.findall(r"^\| `([A-Z_]+)`", table, re.M))
    assert listed == set(_mutants()), sorted(set(_mutants()) ^ listed)
