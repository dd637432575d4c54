"""The Python examples of the documentation (README.md and the site's
pages, docs/*.md), extracted so that tests run each one as it is printed.

Lock and cluster names in the examples are the ones a reader would type
("model-weights", "sglang-30000", "rl-fleet"); ``unique`` prefixes each with
a per-run id, so parallel runs do not collide and a test can find (and
remove) exactly what an example made in /dev/shm."""
import glob
import os
import re
import uuid
from typing import Iterator, List, NamedTuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")
SHM = "/dev/shm"

# The names the examples use; each starts a string literal in the code.
NAMES = re.compile(r"""(["'])(?=model-weights|sglang-|rl-fleet)""")
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.M | re.S)
# Languages a fenced block may have: python runs; the others are shown only
# ("": a bare fence, pseudo-code, shown as text: docs/conf.py's
# highlight_language).
SHOWN = {"", "console", "text", "bash", "yaml", "json", "toml", "ini"}
DIRECTIVES = {"{toctree}", "{include}", "{eval-rst}", "{literalinclude}"}


class Block(NamedTuple):
    path: str        # relative to the checkout
    line: int
    lang: str
    code: str

    @property
    def id(self) -> str:
        return f"{self.path}:{self.line}"

    @property
    def needs_sglang(self) -> bool:
        """Runs only where SGLang is installed (tests/sglang_server)."""
        return "integrations.sglang" in self.code and ".install()" in self.code

    @property
    def needs_etcd(self) -> bool:
        return "pyshmlock.cluster" in self.code


def sources() -> List[str]:
    pages = sorted(f"docs/{f}" for f in os.listdir(DOCS) if f.endswith(".md"))
    return ["README.md"] + pages


def blocks() -> Iterator[Block]:
    for path in sources():
        with open(os.path.join(ROOT, path)) as f:
            text = f.read()
        for m in FENCE.finditer(text):
            info = m.group(1).strip()
            lang = info.split()[0] if info else ""
            yield Block(path, text.count("\n", 0, m.start()) + 1, lang, m.group(2))


def python_blocks() -> List[Block]:
    return [b for b in blocks() if b.lang == "python"]


def unique(code: str, prefix: str) -> str:
    """The example with each of its lock and cluster names prefixed."""
    return NAMES.sub(lambda m: m.group(1) + prefix, code)


def new_prefix() -> str:
    return f"docs{uuid.uuid4().hex[:12]}-"


def leftovers(prefix: str) -> List[str]:
    """Lock names with this prefix still in /dev/shm."""
    base = os.path.join(SHM, "pyshmlock.")
    return sorted(p[len(base):] for p in glob.glob(base + prefix + "*"))
