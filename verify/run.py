"""Run the SPIN model of the lock protocol (verify/shmlock.pml).

    python verify/run.py [--quick] [--mutants-only] [--markers]

For each configuration: generate the verifier with `spin -a`, compile it,
run it, and report the states searched and whether every property held:
assertions (mutual exclusion, no read while paused, resume never during an
update, phase-fair bounds) and invalid end states (a deadlock, or a lost
wake-up: a process asleep forever with no timeout to rescue it).

Each mutant injects one protocol bug; the run passes only if SPIN finds it.
`--markers` prints, for every step of the model, the C line it mirrors.
"""
import argparse
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List, NamedTuple, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL = os.path.join(HERE, "shmlock.pml")
CSRC = os.path.join(os.path.dirname(HERE), "csrc")
CORE = os.path.join(CSRC, "core")      # every C file of the core carries markers
MARKER = re.compile(r"\[model:([A-Z_]+)\]")


class Config(NamedTuple):
    name: str
    defines: Tuple[str, ...]
    exhaustive: bool = True      # False: bitstate (supertrace), a partial search
    quick: bool = True           # part of --quick (and of the test suite)
    reduce: bool = True          # False: partial-order reduction off (see DESIGN.md §9)
    pan_args: Tuple[str, ...] = ()   # e.g. -E: assertions only, no invalid end states


W, R, U, P = "KIND_WRITE", "KIND_READ", "KIND_UPDATE", "KIND_NONE"   # P: pause+resume
S = "KIND_SESSION"      # an update session: begin, an update call, end, resume


def fixed(a: str, b: str, c: str, victim: Optional[int] = None, ops: int = 1) -> Tuple[str, ...]:
    """Three processes with a fixed workload: process i runs the i-th
    operation `ops` times; with a victim, that process may be SIGKILLed at
    any step."""
    deaths = ("MAXDEATHS=0",) if victim is None else ("MAXDEATHS=1", f"VICTIM={victim}")
    return ("NP=3", f"OPS={ops}", *deaths, f"KIND0={a}", f"KIND1={b}", f"KIND2={c}")


FREE3 = ("NP=3", "OPS=1", "MAXDEATHS=0")


def pair(a: str, b: str, victim: Optional[int] = None) -> Tuple[str, ...]:
    """Two processes with a fixed workload (see fixed)."""
    deaths = ("MAXDEATHS=0",) if victim is None else ("MAXDEATHS=1", f"VICTIM={victim}")
    return ("NP=2", "OPS=1", *deaths, f"KIND0={a}", f"KIND1={b}", f"KIND2={P}")


def sessions(a: str, b: str, c: Optional[str] = None, victim: Optional[int] = None
             ) -> Tuple[str, ...]:
    """Update sessions (and the expirer) with a fixed workload of two or
    three processes; with a victim, that process may be SIGKILLed."""
    deaths = ("MAXDEATHS=0",) if victim is None else ("MAXDEATHS=1", f"VICTIM={victim}")
    return ("SESSIONS", f"NP={3 if c else 2}", "OPS=1", *deaths, f"KIND0={a}", f"KIND1={b}",
            f"KIND2={c or P}")

TWO = ("NP=2", "OPS=1", "MAXDEATHS=0")
TWO_DEATH = ("NP=2", "OPS=1", "MAXDEATHS=1")
# thread by thread: a keeper may die before its process, which runs on
TWO_ZOMBIE = TWO_DEATH + ("ZOMBIE",)
# ... under a recovery that trusts the keeper's death (the core before
# liveness.c), checking only that a release never clears a claim it does not
# own (-E: the deadlocks such a recovery makes are not what is asked here)
TRUSTING = TWO_ZOMBIE + ("TRUST_KEEPER_DEATH", "RELEASE_PROPERTY_ONLY")
# the victim closes the lock instead of dying, wherever shl_close lets it:
# between two calls of an operation (an asyncio attempt parked) or between
# operations; its slot is freed clean, without OWNER_DIED
TWO_CLOSE = TWO_DEATH + ("CLOSE",)


def two_by(ops: int, deaths: int = 0) -> Tuple[str, ...]:
    return ("NP=2", f"OPS={ops}", f"MAXDEATHS={deaths}")


def wrap(kind: str = W) -> Tuple[str, ...]:
    """A reader waits while a writer makes 4 claims and a third process
    pauses and resumes, with a 1-bit epoch: the epoch wraps around during
    the reader's wait (the reader requeues behind a claim granted under the
    pause, two claims later the epoch is the reader's again)."""
    return ("NP=3", "OPS=1", "OPS0=1", "OPS1=4", "OPS2=1", "MAXDEATHS=0", "EPOCH_BITS=1",
            f"KIND0={R}", f"KIND1={kind}", f"KIND2={P}")


def free3_victim(v: int, kind: str) -> Tuple[str, ...]:
    """3 processes, free choice, except that process v runs `kind` and may
    be SIGKILLed at any step."""
    return ("NP=3", "OPS=1", "MAXDEATHS=1", f"VICTIM={v}", f"VICTIM_KIND={kind}")




CONFIGS = [
    Config("2 processes x 1 op", TWO),
    Config("2 processes x 1 op, waits may time out", TWO + ("TIMEOUTS",)),
    Config("2 processes x 1 op, one may be SIGKILLed", TWO_DEATH),
    # the same without partial-order reduction: the kill is a rendezvous in
    # an `unless` escape, which SPIN cannot vouch for under reduction
    Config("2 processes x 1 op, SIGKILL, no reduction", TWO_DEATH, reduce=False),
    Config("2 processes x 1 op, one may close the lock", TWO_CLOSE),
    Config("2 processes x 1 op, close, no reduction", TWO_CLOSE, reduce=False),
    Config("2 processes x 1 op, a keeper may die before its process", TWO_ZOMBIE),
    Config("pause+resume, write; the writer's keeper may die first",
           pair(P, W, victim=1) + ("ZOMBIE",)),
    Config("pause+resume, update; the updater's keeper may die first",
           pair(P, U, victim=1) + ("ZOMBIE",)),
    Config("a release under a recovery that trusts the keeper's death", TRUSTING,
           pan_args=("-E",)),
    Config("3 processes: read, update, pause+resume", fixed(R, U, P)),
    Config("session, pause+resume; a session may expire", sessions(S, P)),
    Config("two sessions; either may expire", sessions(S, S)),
    Config("session, pause+resume; the session's process may die", sessions(S, P, victim=0)),
    # the expirer is an operator's handle (no slot): it may die at any step
    # after taking the ending, and an attached process adopts what it left
    Config("session, pause+resume; an operator ends it and may die",
           sessions(S, P) + ("OP_ENDER",)),
    Config("pause+resume, update; the updater may die", pair(P, U, victim=1)),
    Config("pause+resume, write; the writer may die", pair(P, W, victim=1)),
    Config("session, pause+resume; the session's keeper may die first",
           sessions(S, P, victim=0) + ("ZOMBIE",), quick=False),
    Config("session, an update call of another process that may die",
           sessions(S, U, victim=1), quick=False),
    # the operator's death is a rendezvous in an `unless` escape, as a kill
    Config("session, pause+resume; operator may die, no reduction",
           sessions(S, P) + ("OP_ENDER",), reduce=False, quick=False),
    Config("session, read, pause+resume", sessions(S, R, P), quick=False),
    # A 2-bit epoch: the two sessions' four claims wrap it back between the
    # resumer's look and its CAS; the suspect mark in the state word makes
    # that CAS fail (DESIGN.md §9, "A resume whose word comes back bit for
    # bit"; the mutant RESUME_SUSPECT_APART is the mark read apart)
    Config("session, session, pause+resume; 2-bit epoch", sessions(S, S, P), quick=False),
    Config("session, read, pause+resume; the session's process may die",
           sessions(S, R, P, victim=0), quick=False),
    Config("epoch wraps in a reader's wait: read, 4 writes, pause", wrap(), quick=False),
    Config("2 processes x 2 ops", two_by(2), quick=False),
    Config("2 processes x 2 ops, waits may time out", two_by(2) + ("TIMEOUTS",), quick=False),
    Config("2 processes x 3 ops", two_by(3), quick=False),
    Config("2 processes x 2 ops, one may be SIGKILLed", two_by(2, 1), quick=False),
    Config("2 processes x 2 ops, SIGKILL, no reduction", two_by(2, 1), quick=False,
           reduce=False),
    Config("2 processes x 2 ops, one may close the lock", two_by(2, 1) + ("CLOSE",),
           quick=False),
    Config("2 processes x 2 ops, a keeper may die before its process",
           two_by(2, 1) + ("ZOMBIE",), quick=False),
    Config("3 processes x 1 op, free choice", FREE3, quick=False),
    # three exclusive phases can pass a reader only with 2 ops per writer
    Config("3 processes: write, write, read, 2 ops each", fixed(W, W, R, ops=2), quick=False),
] + [
    # Deaths with three processes and a free choice of operation.  One
    # exhaustive search over all of it does not fit in 20 GB (stopped at
    # 3.7e8 states), nor does one per victim.  Per victim and operation of
    # the victim, a dying writer fits (1.3e8 states each); a dying reader,
    # updater or pauser does not fit in 10 GB.  So: the dying writers
    # exhaustively, and everything once as a bitstate search, which may
    # miss states (its hash factor says how likely).
    Config(f"3 x 1 op, free, #{v} (write) may die", free3_victim(v, W), quick=False)
    for v in range(3)
] + [
    Config("3 x 1 op, free, any one may die (bitstate)", FREE3[:2] + ("MAXDEATHS=1",),
           exhaustive=False, quick=False),
]


class Mutant(NamedTuple):
    defines: Tuple[str, ...]     # the configuration that exposes it
    what: str
    quick: bool = True
    caught: bool = True          # False: no checked property depends on it
    pan_args: Tuple[str, ...] = ()


MUTANTS: Dict[str, Mutant] = {
    "NO_SLEEPER_BIT": Mutant(TWO,
                             "waiter does not set SLEEPERS: a release skips FUTEX_WAKE "
                             "(lost wake-up)"),
    "NO_DRAIN_WAKE": Mutant(TWO,
                            "leaving reader does not wake the drainers (lost wake-up)"),
    "ARM_WITHOUT_RESCAN": Mutant(TWO,
                                 "writer arms DRAINERS after its scan and sleeps without "
                                 "scanning again: a reader that left in between woke "
                                 "nobody (lost wake-up)"),
    "READ_IGNORES_PAUSE": Mutant(TWO, "read admitted while paused"),
    "RESUME_IGNORES_UPDATE": Mutant(TWO,
                                    "resume completes during an update"),
    "RECOVERY_KEEPS_CLAIM": Mutant(TWO_DEATH,
                                   "a dead writer's claim is never reclaimed (deadlock)"),
    "SCAN_BEFORE_GRANT": Mutant(fixed(W, R, W),
                                "writer counts readers before GRANTED and never again "
                                "(a late owed reader overlaps it)"),
    "RECLAIM_NO_WAKE": Mutant(fixed(R, R, W, 2),
                              "reclaimer does not wake the others: the kernel woke one "
                              "of two sleepers (lost wake-up)"),
    "NO_OWED_WAIT": Mutant(fixed(W, W, R, ops=2),
                           "writer does not wait for owed readers: writers pass a queued "
                           "reader again and again (reader phase bound)"),
    "DRAIN_ADMITS_ALL": Mutant(two_by(2),
                               "any reader may enter while a claim drains, not only owed "
                               "ones: readers starve the writer (writer bound)"),
    "REQUEUE_MOVES": Mutant(fixed(W, W, R, ops=2),
                            "the first READ_REQUEUE, found by this model: moving the "
                            "registration to a stale epoch lets a third phase pass"),
    "WRAP_REFUSES": Mutant(wrap(),
                           "owed reader enters only a claim of an epoch other than its "
                           "own: after a wrap the claim that waits for it has its epoch "
                           "(deadlock)"),
    "CLOSE_IN_FLIGHT": Mutant(TWO_CLOSE,
                              "close() refuses only while the process holds the lock, as "
                              "before: it frees the slot under a call of another thread "
                              "(lost wake-up or orphaned claim: deadlock)"),
    "HWM_LATE": Mutant(TWO,
                       "the slots' high-water mark is raised only after the reader's "
                       "first look at the state word: a writer's bounded scan misses "
                       "an admitted reader"),
    "HWM_STALE": Mutant(TWO,
                        "the writer loads the slots' high-water mark before its claim, "
                        "not after: a reader that attached in between is missed"),
    "NO_SAFETY_NET": Mutant(free3_victim(2, W),
                            "no safety net: a reader asleep before a writer attached is "
                            "never woken when that writer dies between its claim and its "
                            "wake-up (found by the full run of this configuration)",
                            quick=False),
    "RESUME_IGNORES_SESSION": Mutant(sessions(S, P),
                                     "resume does not wait for an update session's pin: "
                                     "the gate opens between the session's calls"),
    "SESSION_END_NO_WAKE": Mutant(sessions(S, P),
                                  "a session's end clears the pin without waking the "
                                  "resume that sleeps on it (lost wake-up)"),
    "END_IGNORES_TOKEN": Mutant(sessions(S, S),
                                "end_session ends whatever session pins the pause: a late "
                                "end of an expired session unpins the next one"),
    "EXPIRE_MARKS_LATE": Mutant(sessions(S, P),
                                "an expiring session is marked suspect after its unpin: a "
                                "resume in between opens on half-loaded data"),
    "RELEASE_CLEARS_ALWAYS": Mutant(sessions(S, P),
                                    "every completed update clears the suspect mark, also an "
                                    "update call of a session that expired around it (the "
                                    "model found this in the first session design)"),
    "RECOVERY_KEEPS_ENDING": Mutant(sessions(S, P, victim=0),
                                    "a process that dies after taking a session's end and "
                                    "before the unpin leaves the pause pinned for ever"),
    "ADOPT_IGNORES_LIVENESS": Mutant(sessions(S, P) + ("OP_ENDER",),
                                     "an attached process takes over an operator's session "
                                     "ending without asking whether the operator lives: both "
                                     "unpin, the second clearing a pin it does not own"),
    "ADOPT_NO_WAKE": Mutant(sessions(S, P) + ("OP_ENDER",),
                            "the adopter of a dead operator's ending does not wake the "
                            "sleepers: an operator that died between its unpin and its "
                            "wake-up leaves a resume asleep for ever (lost wake-up)"),
    "OP_ENDING_NEVER_ADOPTED": Mutant(sessions(S, P) + ("OP_ENDER",),
                                      "nobody finishes the session ending of an operator "
                                      "that died after taking it: the pause stays pinned "
                                      "for ever (deadlock)"),
    "RESUME_IGNORES_SUSPECT": Mutant(pair(P, U, victim=1),
                                     "resume opens the gate after an updater died "
                                     "mid-update (half-swapped data)"),
    "RECOVER_MARK_LATE": Mutant(fixed(P, U, P, victim=1),
                                "recovery marks a dead updater's data suspect only after "
                                "clearing its claim: a resume in between opens the gate"),
    "EXPIRE_NO_RECHECK": Mutant(sessions(S, S),
                                "an expiry takes the token without checking that it is "
                                "pinned: it ends a session whose pinner has not set PINNED "
                                "yet, which then stays pinned for ever"),
    "END_CLEARS_ALWAYS": Mutant(sessions(S, U, victim=1),
                                "a normal session end clears the suspect mark without "
                                "comparing counts: a lost update call inside the session "
                                "is forgotten", quick=False),
    "RESUME_NO_WRITER_PROBE": Mutant(pair(P, W, victim=1),
                                     "resume opens the gate beside a granted writer that "
                                     "died, before its reclaim marks the data"),
    "RECLAIM_ON_KEEPER_DEATH": Mutant(TWO_ZOMBIE,
                                      "a slot is reclaimed once its keeper thread is dead, "
                                      "while the rest of its process runs on: a new holder "
                                      "beside the old one (the core before liveness.c)"),
    "RELEASE_NO_OWNER_RECHECK": Mutant(TRUSTING,
                                       "the exclusive release checks the owner once, before "
                                       "its CAS loop: under a recovery that trusts the "
                                       "keeper's death, a late release clears the next "
                                       "claimant's claim", pan_args=("-E",)),
    "RESUME_SUSPECT_APART": Mutant(sessions(S, S, P),
                                   "resume reads the suspect mark apart from the state word "
                                   "its CAS compares (the layout before 4): two sessions "
                                   "wrap the 2-bit epoch back between its look and its CAS, "
                                   "and it opens the gate on an expired session's data",
                                   quick=False),
    "NO_REQUEUE": Mutant(fixed(W, W, R, ops=2),
                         "owed reader does not requeue behind a granted later claim: "
                         "the two-phase bound still holds (requeue shortens the common "
                         "case only)", quick=False, caught=False),
}


class Outcome(NamedTuple):
    errors: int
    states: float
    seconds: float
    complete: bool     # exhaustive and finished: every reachable state searched
    finished: bool     # not cut by the time or memory limit
    detail: str


def run_spin(defines: Tuple[str, ...], exhaustive: bool, timeout: float,
             memory_mb: int = 12000, reduce: bool = True, optimize: str = "-O2",
             pan_args: Tuple[str, ...] = ()) -> Outcome:
    """One verification run in a scratch directory.  reduce=False turns off
    SPIN's partial-order reduction; optimize "-O0" compiles in a quarter of
    the time and runs at half the speed (for small searches)."""
    # The verifier is a plain binary: never run it under a preloaded
    # sanitizer (`make sanitize` preloads ASan for the Python process).
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    work = tempfile.mkdtemp(prefix="pyshmlock-spin-")
    try:
        shutil.copy(MODEL, work)
        dflags = [f"-D{d}" for d in defines]
        subprocess.run(["spin", "-a", *dflags, "shmlock.pml"], cwd=work, check=True,
                       capture_output=True, text=True, timeout=60, env=env)
        cflags = [optimize, "-DSAFETY", f"-DMEMLIM={memory_mb}"]
        cflags += [] if reduce else ["-DNOREDUCE"]
        cflags += ["-DCOLLAPSE"] if exhaustive else ["-DBITSTATE"]
        subprocess.run(["gcc", *cflags, "-o", "pan", "pan.c"], cwd=work, check=True,
                       capture_output=True, text=True, timeout=900, env=env)
        # bitstate: the largest power-of-two bit array in 3/4 of the memory
        bits = max(27, min(40, int(math.log2(memory_mb * 0.75 * 8 * 2 ** 20))))
        args = ["./pan", "-m4000000", *pan_args] + ([] if exhaustive else [f"-w{bits}"])
        t0 = time.monotonic()
        p = subprocess.Popen(args, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, env=env)
        try:
            out, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.send_signal(signal.SIGINT)    # pan stops and prints its statistics
            out, _ = p.communicate(timeout=60)
            out += "\nSearch not completed (time limit)"
        seconds = time.monotonic() - t0
        m = re.search(r"errors: (\d+)", out)
        errors = int(m.group(1)) if m else -1
        m = re.search(r"([\d.e+]+) states, stored", out)
        states = float(m.group(1)) if m else 0.0
        finished = "Search not completed" not in out and "Interrupted" not in out
        complete = finished and exhaustive
        first = re.search(r"pan:1: (.*)", out)
        detail = first.group(1) if first else ""
        factor = re.search(r"hash factor: ([\d.e+]+)", out)
        if factor and not exhaustive:    # bits per state: coverage is good above 100
            detail = (detail + "; " if detail else "") + f"hash factor {float(factor.group(1)):.0f}"
        return Outcome(errors, states, seconds, complete, finished, detail)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def default_memory_mb() -> int:
    """80% of the memory available now (the largest searches need ~20 GB)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return max(1000, int(line.split()[1]) * 8 // 10 // 1024)
    except OSError:
        pass
    return 12000


def markers() -> List[Tuple[str, Optional[str]]]:
    """Every marker of the model with the place (csrc/core/FILE:LINE) in the C
    core that carries it, or None."""
    with open(MODEL) as f:
        in_model = sorted(set(MARKER.findall(f.read())))
    places: Dict[str, str] = {}
    rel = os.path.relpath(CORE, os.path.dirname(CSRC))
    for c in sorted(os.listdir(CORE)):
        if not c.endswith((".c", ".h")):
            continue
        with open(os.path.join(CORE, c)) as f:
            for n, line in enumerate(f, 1):
                for name in MARKER.findall(line):
                    places.setdefault(name, f"{rel}/{c}:{n}")
    return [(name, places.get(name)) for name in in_model]


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="only the small configurations")
    ap.add_argument("--mutants-only", action="store_true")
    ap.add_argument("--markers", action="store_true", help="print model step -> C line")
    ap.add_argument("--timeout", type=float, default=1800.0,
                    help="seconds per run; a run cut there is reported as incomplete")
    ap.add_argument("--only", default="",
                    help="only the configurations and mutants whose name contains this")
    ap.add_argument("--jobs", type=int, default=0,
                    help="searches run side by side (default: one per CPU with --quick, "
                         "else 1)")
    ap.add_argument("--memory-mb", type=int, default=default_memory_mb(),
                    help="memory for one search (default: 80%% of what is available)")
    args = ap.parse_args(argv)
    if shutil.which("spin") is None:
        print("spin is not installed (Debian: apt-get install spin)", file=sys.stderr)
        return 2
    if args.markers:
        for name, place in markers():
            print(f"  [model:{name}]  {place if place else 'MISSING'}")
    ok = True
    opt = "-O0" if args.quick else "-O2"    # small searches: compiling dominates
    # Small searches run side by side (compiling pan.c dominates them); the
    # large ones one at a time, each with the memory.
    jobs = args.jobs or (os.cpu_count() or 1 if args.quick else 1)
    memory = max(1000, args.memory_mb // jobs)
    configs = [c for c in CONFIGS if not (args.quick and not c.quick)
               and args.only in c.name] if not args.mutants_only else []
    mutants = [(n, m) for n, m in MUTANTS.items() if not (args.quick and not m.quick)
               and args.only in n]
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        runs = [pool.submit(run_spin, c.defines, c.exhaustive, args.timeout, memory,
                            reduce=c.reduce, optimize=opt, pan_args=c.pan_args)
                for c in configs]
        mruns = [pool.submit(run_spin, m.defines + (f"MUTANT_{n}",), True, args.timeout,
                             memory, optimize=opt, pan_args=m.pan_args) for n, m in mutants]
        if configs:
            print("protocol (every property must hold):")
        for cfg, fut in zip(configs, runs):
            r = fut.result()
            held = r.errors == 0
            kind = ("exhaustive" if r.complete else "INCOMPLETE" if cfg.exhaustive else
                    "bitstate" if r.finished else "bitstate, cut at the time limit")
            ok = ok and held and (r.complete or not cfg.exhaustive)
            print(f"  {'HOLDS' if held else 'FAILS'}  {cfg.name:44} {r.states:>14,.0f} states "
                  f"({kind}, {r.seconds:.1f} s){'  ' + r.detail if r.detail else ''}",
                  flush=True)
        print("mutants (each must be caught, unless marked as not needed):")
        for (name, m), fut in zip(mutants, mruns):
            r = fut.result()
            caught = r.errors > 0
            if m.caught:
                good, verdict = caught, "CAUGHT" if caught else "MISSED"
            else:   # must hold, exhaustively: the property does not depend on it
                good = not caught and r.complete
                verdict = "NOT NEEDED" if good else "UNEXPECTED"
            ok = ok and good
            print(f"  {verdict}  {name:22} {m.what}\n"
                  f"          -> {r.detail or 'no error found'} ({r.states:,.0f} states, "
                  f"{'complete, ' if r.complete else ''}{r.seconds:.1f} s)", flush=True)
    print("all properties hold and every mutant is caught" if ok else "VERIFICATION FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
