# Sphinx configuration of pyshmlock's documentation site.
#
# Choice: Sphinx + myst-parser, because the pages stay Markdown (README,
# DESIGN.md, OPERATIONS.md are read on GitHub too) while autodoc builds the
# API reference from the docstrings.  Theme: furo (as pip, attrs and black
# use), pinned with the rest in the `docs` extra; docs/_static/wide.css
# widens its text column so that code and tables show whole.
#
# Build: python -m sphinx -W --keep-going -b html docs docs/_build/html
# (tests/test_docs_site.py does this with -W: any warning fails the suite).
import importlib.machinery
import importlib.util
import os
import sys

ROOT = os.path.realpath(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _import_the_installed_package():
    """autodoc documents the installed package.  The README's command,
    `pip install '.[docs]' && python -m sphinx -b html docs docs/_build/html`,
    runs from the checkout's root, and `python -m` puts that directory first
    on sys.path, where pyshmlock/ is the source tree: unless it was built in
    place, it has no compiled modules, so the root leaves sys.path and the
    installed copy is imported instead."""
    source = os.path.join(ROOT, "pyshmlock")
    built = all(importlib.machinery.PathFinder.find_spec(m, [source])
                for m in ("_shmlock", "_fast"))
    if not built:
        sys.path[:] = [p for p in sys.path if os.path.realpath(p or os.curdir) != ROOT]
    try:
        import pyshmlock
    except ModuleNotFoundError as e:
        if e.name != "pyshmlock":
            raise
        raise ImportError(f"the site documents the installed pyshmlock, and none is "
                          f"installed: pip install '.[docs]' in {ROOT}") from None
    return pyshmlock


pyshmlock = _import_the_installed_package()


def _mutants() -> dict:
    """The model check's mutants (verify/run.py): the docs quote their count."""
    spec = importlib.util.spec_from_file_location("_verify_run",
                                                  os.path.join(ROOT, "verify", "run.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.MUTANTS


MUTANTS = _mutants()


def _write_mutant_table() -> None:
    """docs/_generated/mutants.md: every mutant the model check runs, with
    what it injects, from verify/run.py (the verification page includes it)."""
    rows = ["| mutant | what it injects | expected |", "|---|---|---|"]
    for name, m in MUTANTS.items():
        what = m.what.replace("|", "\\|")
        expected = "caught" if m.caught else "holds (no checked property needs the step)"
        quick = "" if m.quick else " (`make verify` only)"
        rows.append(f"| `{name}`{quick} | {what} | {expected} |")
    out = os.path.join(ROOT, "docs", "_generated")
    os.makedirs(out, exist_ok=True)
    text = "\n".join(rows) + "\n"
    path = os.path.join(out, "mutants.md")
    try:
        with open(path) as f:
            if f.read() == text:
                return
    except OSError:
        pass
    with open(path + f".{os.getpid()}", "w") as f:
        f.write(text)
    os.replace(path + f".{os.getpid()}", path)


_write_mutant_table()

# pyshmlock.cluster imports its names lazily (module __getattr__), which
# autodoc cannot see: resolve them once, so the reference lists every name.
_cluster = importlib.import_module("pyshmlock.cluster")
vars(_cluster).update({n: getattr(_cluster, n) for n in _cluster.__all__})

project = "pyshmlock"
author = "The pyshmlock authors"
copyright = "the pyshmlock authors"
release = pyshmlock.__version__ if hasattr(pyshmlock, "__version__") else ""
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
]
source_suffix = {".md": "markdown"}
root_doc = "index"
# A bare fence is pseudo-code or output, not Python: only ```python blocks
# are Python, and the suite runs every one of them (tests/test_docs_site.py).
highlight_language = "text"
exclude_patterns = ["_build", "_generated", "prometheus", "Thumbs.db", ".DS_Store"]

# Markdown: GitHub-style heading anchors, so links such as
# OPERATIONS.md#a-stale-segment-after-a-restart work on the site and on GitHub.
myst_heading_anchors = 4
# html_image: an <img> with a width (the benchmark chart) is shown scaled to
# the column and linked to the full-size image, here and on GitHub.
myst_enable_extensions = ["colon_fence", "deflist", "substitution", "html_image"]
# Figures the pages derive from the code instead of copying them.
myst_substitutions = {
    "mutant_count": str(len(MUTANTS)),
    "mutants_caught": str(sum(1 for m in MUTANTS.values() if m.caught)),
    "mutants_holding": ", ".join(f"`{n}`" for n, m in MUTANTS.items() if not m.caught),
}

# The reference: members in source order, every public name documented.
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"members": True, "show-inheritance": True}

html_theme = "furo"
html_title = "pyshmlock"
html_static_path = ["_static"]
# Code and tables shown whole at 1280 px (tests/test_docs_site.py checks it
# in a headless browser): a wider text column than furo's 46em.
html_css_files = ["wide.css"]
