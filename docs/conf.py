# Sphinx configuration of pyshmlock's documentation site.
#
# Choice: Sphinx + myst-parser, because the pages stay Markdown (README,
# DESIGN.md, OPERATIONS.md are read on GitHub too) while autodoc builds the
# API reference from the docstrings.  Theme: the built-in alabaster, so the
# site needs nothing beyond the two pinned packages (the `docs` extra).
#
# Build: python -m sphinx -W --keep-going -b html docs docs/_build/html
# (tests/test_docs_site.py does this with -W: any warning fails the suite).
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

import importlib.util  # noqa: E402

import pyshmlock  # noqa: E402  (the installed package: autodoc imports it)


def _mutants() -> dict:
    """The model check's mutants (verify/run.py): the docs quote their count."""
    spec = importlib.util.spec_from_file_location("_verify_run",
                                                  os.path.join(ROOT, "verify", "run.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.MUTANTS


MUTANTS = _mutants()

# pyshmlock.cluster imports its names lazily (module __getattr__), which
# autodoc cannot see: resolve them once, so the reference lists every name.
import pyshmlock.cluster  # noqa: E402

vars(pyshmlock.cluster).update(
    {n: getattr(pyshmlock.cluster, n) for n in pyshmlock.cluster.__all__})

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
exclude_patterns = ["_build", "prometheus", "Thumbs.db", ".DS_Store"]

# Markdown: GitHub-style heading anchors, so links such as
# OPERATIONS.md#a-stale-segment-after-a-restart work on the site and on GitHub.
myst_heading_anchors = 4
myst_enable_extensions = ["colon_fence", "deflist", "substitution"]
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

html_theme = "alabaster"
html_title = "pyshmlock"
html_static_path: list = []
html_theme_options = {
    "description": "A cross-process reader/writer lock with a pause gate",
    "fixed_sidebar": True,
}
