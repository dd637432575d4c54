"""Holding a narrow window open: gdb attached to a child process in non-stop
mode stops one of its threads at a function (the others keep running), so a
test can make two steps of the core meet in the order it needs.  Shared by
the tests of races no timing can hit reliably."""
import os
import subprocess
import sys
import time


class Gdb:
    """gdb attached in non-stop mode: a breakpoint stops only its thread."""

    def __init__(self, pid):
        # gdb itself never runs under a sanitizer's preload (a sanitizer
        # run of the suite preloads ASan for the processes under test).
        env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
        self.p = subprocess.Popen(
            ["gdb", "-q", "-nx", "-iex", "set non-stop on", "-iex", "set pagination off",
             "-iex", "set confirm off", "-p", str(pid)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env=env)
        os.set_blocking(self.p.stdout.fileno(), False)
        self.out = ""

    def send(self, cmd):
        self.p.stdin.write(cmd + "\n")
        self.p.stdin.flush()

    def expect(self, text, timeout):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                s = self.p.stdout.read()
            except TypeError:
                s = None
            if s:
                self.out += s
            if text in self.out:
                return
            time.sleep(0.02)
        raise AssertionError(f"gdb: no {text!r} in:\n{self.out[-3000:]}")

    def close(self):
        try:
            self.send("detach")
            self.send("quit")
            self.p.wait(5)
        except Exception:
            pass
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait(5)


def spawn(code, *args):
    return subprocess.Popen([sys.executable, "-c", code, *args], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)


def kill(p):
    if p.poll() is None:
        p.kill()
    p.wait(5)
