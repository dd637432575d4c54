"""The memory orders of the C sources, checked so that they cannot drift.

    python verify/ordering_lint.py [CSRC]      # exit 1 and a list on a finding

An audit of every atomic found the orders right (docs/verification.md,
"What is verified where"); this keeps them so:

1. Every atomic operation that mirrors a step of the model (a line carrying
   a ``[model:NAME]`` marker, or the statement it ends) is seq_cst: the
   model (verify/shmlock.pml) checks the protocol under sequential
   consistency, which only seq_cst operations give on every architecture.
2. Every atomic operation says its order (``*_explicit`` with
   ``memory_order_*``, or ``__atomic_*`` with ``__ATOMIC_*``); the implicit
   seq_cst forms (``atomic_load(&x)``) are refused, so that an order is
   always a decision written down.
3. Every atomic operation whose order is not seq_cst has a comment that
   says why: within the few lines above it (or on it), a comment naming the
   order (``relaxed``, ``acquire``, ``release``); or, for a field that is
   accessed the same way everywhere, the comment of the field's declaration
   (``_Atomic ... name;  /* ... relaxed ... */``: observability fields,
   process-private ones).  seq_cst operations belong to a handshake, and
   the handshakes are named in the file's head comment and DESIGN.md.

The checks are textual and conservative: a statement is the text from its
first line to the ``;`` that ends it.
"""
import os
import re
import sys
from typing import Iterator, List, NamedTuple, Set, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
CSRC = os.path.join(os.path.dirname(HERE), "csrc")

# An atomic operation, and the orders written in it.
OP = re.compile(r"\b(atomic_\w+|__atomic_\w+)\s*\(")
ORDER = re.compile(r"\b(memory_order_(\w+)|__ATOMIC_(\w+))\b")
MARKER = re.compile(r"\[model:([A-Z_]+)\]")
# Operations that take no order (types, initialisation, fences are checked too).
NOT_OPS = {"atomic_init", "atomic_is_lock_free", "atomic_flag"}
EXPLAINS = re.compile(r"relaxed|acquire|release|seq_cst|consume|\[model:", re.I)
COMMENT_LOOKBACK = 14      # lines above an operation where its reason may stand


class Finding(NamedTuple):
    path: str
    line: int
    what: str


def c_files(root: str) -> Iterator[str]:
    for folder, _, names in sorted(os.walk(root)):
        for name in sorted(names):
            if name.endswith((".c", ".h")):
                yield os.path.join(folder, name)


def _statement_end(lines: List[str], i: int) -> int:
    """The index of the line where the statement beginning at line i ends."""
    depth = 0
    for j in range(i, min(i + 12, len(lines))):
        code = lines[j].split("//")[0]
        depth += code.count("(") - code.count(")")
        if depth <= 0 and (";" in code or "{" in code):
            return j
    return i


def _comment_before(lines: List[str], i: int) -> str:
    """The comments on line i and in the lines above it, up to the previous
    blank line or function start (at most COMMENT_LOOKBACK lines)."""
    text = []
    for j in range(i, max(-1, i - COMMENT_LOOKBACK), -1):
        line = lines[j]
        if j < i and (not line.strip() or line.startswith("}")):
            break
        if "/*" in line or "*/" in line or line.lstrip().startswith("*") or "//" in line:
            text.append(line)
    return "\n".join(text)


FIELD = re.compile(r"_Atomic\s*(?:\(\s*[\w\s*]+\))?[\w\s]*?\b(\w+)\s*(?:\[[^\]]*\])?\s*;")
TARGET = re.compile(r"\(\s*\(?\s*&\s*\(?([\w>\-.\[\]]+)")


def relaxed_fields(root: str) -> Set[str]:
    """Fields (and process-private globals) whose declaration says they are
    accessed with weaker orders, and why: the comment on the declaration's
    line, or on the lines just above it, names the order."""
    out: Set[str] = set()
    for path in c_files(root):
        with open(path) as f:
            lines = f.read().split("\n")
        for i, line in enumerate(lines):
            m = FIELD.search(line.split("/*")[0])
            if m and EXPLAINS.search(_comment_before(lines, i) + line):
                out.add(m.group(1))
    return out


def _names_order(comment: str, weak: List[str]) -> bool:
    """Does the comment say why, naming one of the weaker orders used (a
    compare-exchange's failure order may be what it names)?"""
    said = comment.lower()
    return any(o in said or (o == "acq_rel" and ("acquire" in said or "release" in said))
               for o in weak)


def _target(own: str) -> str:
    """The name of the field or variable an operation's first argument
    points at (the last component of &a->b.c[i])."""
    m = TARGET.search(own)
    if not m:
        return ""
    return re.split(r"->|\.", m.group(1))[-1].split("[")[0]


def lint_file(path: str, fields: Set[str] = frozenset()) -> List[Finding]:
    with open(path) as f:
        lines = f.read().split("\n")
    found: List[Finding] = []
    rel = os.path.relpath(path, os.path.dirname(CSRC))
    in_comment = False
    for i, line in enumerate(lines):
        code = line
        # Skip comment text (a /* ... */ block may name atomics in prose).
        if in_comment:
            if "*/" not in code:
                continue
            code = code.split("*/", 1)[1]
            in_comment = False
        code = re.sub(r"/\*.*?\*/", "", code)
        if "/*" in code:
            code, in_comment = code.split("/*", 1)[0], True
        code = code.split("//")[0]
        for m in OP.finditer(code):
            name = m.group(1)
            if name in NOT_OPS or name.startswith("atomic_flag"):
                continue
            if name in ("__atomic_always_lock_free", "__atomic_is_lock_free"):
                continue
            end = _statement_end(lines, i)
            stmt = "\n".join(lines[i:end + 1])
            # The orders of this operation: those written after its name in
            # the statement (up to the next operation on the same line).
            rest = stmt[stmt.find(name, m.start()) if i == i else 0:]
            nxt = OP.search(rest, len(name))
            own = rest[:nxt.start()] if nxt else rest
            orders = [(o.group(2) or o.group(3)).lower() for o in ORDER.finditer(own)]
            markers = MARKER.findall("\n".join(lines[i:end + 1]))
            if not orders and name.startswith("atomic_") and not name.endswith("_explicit"):
                found.append(Finding(rel, i + 1, f"{name}: implicit order (write it down: "
                                                  f"{name}_explicit with memory_order_*)"))
                continue
            if not orders:
                continue       # e.g. atomic_thread_fence is caught by the order rule below
            if markers and any(o != "seq_cst" for o in orders):
                found.append(Finding(rel, i + 1, f"{name} mirrors model step(s) "
                                                  f"{', '.join(markers)} but is "
                                                  f"{'/'.join(orders)}, not seq_cst"))
            weak = sorted({o for o in orders if o != "seq_cst"})
            if weak and _target(own) not in fields and not _names_order(
                    _comment_before(lines, end), weak):
                found.append(Finding(rel, i + 1, f"{name} is {'/'.join(orders)} with no "
                                                  "comment saying why"))
    return found


def lint(root: str = CSRC) -> List[Finding]:
    fields = relaxed_fields(root)
    out: List[Finding] = []
    for path in c_files(root):
        out += lint_file(path, fields)
    return out


def main(argv: List[str]) -> int:
    root = argv[1] if len(argv) > 1 else CSRC
    findings = lint(root)
    for f in findings:
        print(f"{f.path}:{f.line}: {f.what}")
    if findings:
        print(f"{len(findings)} finding(s)", file=sys.stderr)
        return 1
    print("every atomic says its order; every model step is seq_cst; every weaker "
          "order says why")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))


__all__: Tuple[str, ...] = ("Finding", "lint")
