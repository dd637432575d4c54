"""A shared-memory invariant checker for stress tests.

Each worker reports entering and leaving its holds; the checker (counters in
an mp.Array under one mp.Lock) records a violation whenever
  - a writer is beside a reader or another exclusive holder,
  - a reader is beside a writer, or beside an update while not paused,
  - an update runs while neither paused nor exclusive,
  - a read hold is granted while a pause was in force for the whole attempt.
Pause and resume go through pause()/resume() here, which keep a "pause
confirmed" flag and a generation counter in step with the lock."""

READERS, WRITERS, UPDATES, VIOLATIONS, PAUSE_CONFIRMED, GATE_GEN, GRANTS = range(7)


class Checker:
    def __init__(self, ctx):
        self.c = ctx.Array("q", 8, lock=False)
        self.mu = ctx.Lock()
        self.gate_mu = ctx.Lock()
        self.notes = ctx.Queue()

    def _violate(self, what):
        self.c[VIOLATIONS] += 1
        self.notes.put(what)

    def gate_snapshot(self):
        with self.mu:
            return self.c[PAUSE_CONFIRMED], self.c[GATE_GEN]

    def enter_read(self, before, lock):
        with self.mu:
            # A reader admitted before a pause may report in after an update
            # was (rightly) granted under that pause; admission during the
            # pause itself is the "read granted while paused" rule below.
            if self.c[WRITERS] or (self.c[UPDATES] and not lock.paused):
                self._violate("reader beside an exclusive holder")
            if before[0] and self.c[GATE_GEN] == before[1]:
                self._violate("read granted while paused")
            self.c[READERS] += 1
            self.c[GRANTS] += 1

    def leave_read(self):
        with self.mu:
            self.c[READERS] -= 1

    def enter_write(self):
        with self.mu:
            if self.c[READERS] or self.c[WRITERS] or self.c[UPDATES]:
                self._violate("writer beside another holder")
            self.c[WRITERS] += 1
            self.c[GRANTS] += 1

    def leave_write(self):
        with self.mu:
            self.c[WRITERS] -= 1

    def enter_update(self, lock):
        with self.mu:
            if self.c[WRITERS] or self.c[UPDATES]:
                self._violate("update beside another exclusive holder")
            if self.c[READERS] and not lock.paused:
                self._violate("update beside readers while not paused")
            self.c[UPDATES] += 1
            self.c[GRANTS] += 1

    def leave_update(self):
        with self.mu:
            self.c[UPDATES] -= 1

    def pause(self, lock, timeout=5):
        if not self.gate_mu.acquire(timeout=timeout):
            return
        try:
            lock.pause()
            with self.mu:
                self.c[PAUSE_CONFIRMED] = 1
                self.c[GATE_GEN] += 1
        finally:
            self.gate_mu.release()

    def resume(self, lock, timeout=5):
        if not self.gate_mu.acquire(timeout=timeout):
            return False
        try:
            with self.mu:
                self.c[PAUSE_CONFIRMED] = 0
                self.c[GATE_GEN] += 1
            return lock.resume(timeout)
        finally:
            self.gate_mu.release()

    @property
    def violations(self):
        return self.c[VIOLATIONS]

    @property
    def grants(self):
        return self.c[GRANTS]

    def drain_notes(self):
        out = []
        while True:
            try:
                out.append(self.notes.get(timeout=0.05))
            except Exception:
                return out


def random_worker(q, name, checker, duration, seed, weights=(50, 15, 15, 5, 15)):
    """Mix read / write / update / pause / resume at random for `duration` s."""
    import random
    import time

    import pyshmlock
    rnd = random.Random(seed)
    lk = pyshmlock.RWLock(name)
    ops = ["read", "write", "update", "pause", "resume"]
    end = time.monotonic() + duration
    done = 0
    while time.monotonic() < end:
        op = rnd.choices(ops, weights)[0]
        hold = rnd.random() * 0.001
        if op == "read":
            before = checker.gate_snapshot()
            if lk.acquire_read(0.5):
                checker.enter_read(before, lk)
                time.sleep(hold)
                checker.leave_read()
                lk.release_read()
        elif op == "write":
            if lk.acquire_write(0.5):
                checker.enter_write()
                time.sleep(hold)
                checker.leave_write()
                lk.release_write()
        elif op == "update":
            if lk.acquire_update(0.5):
                checker.enter_update(lk)
                time.sleep(hold)
                checker.leave_update()
                lk.release_update()
        elif op == "pause":
            checker.pause(lk)
        else:
            checker.resume(lk)
        done += 1
    q.put(done)
    lk.close()
