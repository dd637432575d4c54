"""Instructions per call of the uncontended cases, counted by callgrind.

Seconds depend on the machine and on whoever else runs on it; instructions
do not: valgrind's callgrind counts them exactly, so a change's cost shows
the same on a laptop, a loaded CI runner or an emulator.  Every case of the
"uncontended calls" figure (pyshmlock and each peer, the floors, the asyncio
rows) runs in one child process under

    valgrind --tool=callgrind --dump-before=floor_callgrind_mark

The child calls the floor module's ``callgrind_mark()`` (csrc/floor_capi.c)
around two runs of each case's loop, of n and 2n iterations; callgrind
closes one counted part at each mark.  The difference of the two parts is
n iterations exactly (the call of the loop, the marks and whatever else is
paid once cancel), and the same difference for an empty loop is taken off:
what is left is the case's body, per iteration.  The garbage collector is
off in the child, so that no collection lands in one part only.

Without valgrind, or without the floor module (no C compiler, no sources),
every row says why it was skipped.
"""
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
from typing import Any, Dict

MARK = "floor_callgrind_mark"
EMPTY = "empty loop"


def _child(n: int) -> None:
    """Under callgrind: mark, loop(n), mark, loop(2n), mark, for every case
    in order (the empty loop first); print the labels, one per line."""
    import gc

    from .floors import capi_floor
    from .uncontended import _async_loop, _uncontended_cases
    mark = capi_floor().callgrind_mark
    cases, cleanups = _uncontended_cases()
    labels = []
    try:
        loops = {}
        ns: Dict[str, Any] = {}
        exec("def loop(n):\n    for _ in range(n):\n        pass\n", ns)
        loops[EMPTY] = ns["loop"]
        for label, (body, env) in cases.items():
            if not body:
                continue
            if "__loop__" in env:
                loops[label] = _async_loop(body, env, cleanups)
                continue
            ns = dict(env)
            exec(f"def loop(n):\n    for _ in range(n):\n        {body}\n", ns)
            loops[label] = ns["loop"]
        for loop in loops.values():
            loop(n // 10)                  # warm up: caches, specialisation
        gc.disable()
        for label, loop in loops.items():
            mark()
            loop(n)
            mark()
            loop(2 * n)
            mark()
            labels.append(label)
        gc.enable()
    finally:
        for c in cleanups:
            c()
    print("\n".join(labels))


def _part_totals(out: str) -> Dict[int, int]:
    """Instructions of each dumped part: {part number: Ir}."""
    parts = {}
    for path in glob.glob(out + ".*"):
        m = re.search(r"\.(\d+)$", path)
        if m is None:
            continue
        with open(path) as f:
            text = f.read()
        t = re.search(r"^(?:totals|summary):\s*(\d+)", text, re.M)
        if t is not None:
            parts[int(m.group(1))] = int(t.group(1))
    return parts


def instructions(n: int = 2000, timeout: float = 600.0) -> Dict[str, Any]:
    """{label: {"instructions": per iteration} or {"error": why}} for every
    uncontended case, with "vs_multiprocessing_lock" beside pyshmlock's."""
    if shutil.which("valgrind") is None:
        return {"error": "skipped: valgrind is not installed (apt-get install valgrind)"}
    try:
        from .floors import capi_floor
        capi_floor()           # built here, not under valgrind
    except ImportError as e:
        return {"error": f"skipped: the mark needs the floor module ({e.name} unavailable)"}
    with tempfile.TemporaryDirectory(prefix="pyshmlock-callgrind-") as d:
        out = os.path.join(d, "cg.out")
        cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
               f"--dump-before={MARK}", "--dump-instr=no",
               sys.executable, "-c",
               f"from pyshmlock_lab.bench.instructions import _child; _child({n})"]
        env = dict(os.environ, PYTHONHASHSEED="0")
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        except subprocess.TimeoutExpired:
            return {"error": f"callgrind run took over {timeout:.0f} s"}
        if p.returncode != 0:
            tail = (p.stderr or p.stdout).strip().splitlines()[-3:]
            return {"error": f"callgrind run failed ({p.returncode}): {' | '.join(tail)}"}
        labels = p.stdout.strip().splitlines()
        parts = _part_totals(out)
    # Part k ends at the k-th mark: case i's loops are parts 3i+2 and 3i+3.
    per: Dict[str, float] = {}
    for i, label in enumerate(labels):
        once, twice = parts.get(3 * i + 2), parts.get(3 * i + 3)
        if once is None or twice is None:
            return {"error": f"callgrind wrote {len(parts)} parts for {len(labels)} cases"}
        per[label] = (twice - once) / n
    empty = per.pop(EMPTY)
    rows: Dict[str, Any] = {label: {"instructions": v - empty} for label, v in per.items()}
    base = rows.get("multiprocessing.Lock pair", {}).get("instructions")
    for label, row in rows.items():
        if base and label.startswith("pyshmlock") and "(" not in label:
            row["vs_multiprocessing_lock"] = row["instructions"] / base
    return rows
