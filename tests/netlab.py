"""Real partitions for the cluster tests: each node (an etcd member, a host,
a controller) in its own network namespace, one veth each into a bridge in
a fabric namespace.  Cutting a node's link (its bridge-side veth down) drops
its packets silently, as a pulled cable or a partition does: open TCP
connections hang, new ones time out.  Every address is in namespaces made
here; ``close()`` deletes every namespace (and with them every veth), also
after a failure.
"""
import os
import random
import shutil
import subprocess
import uuid


def available():
    if os.geteuid() != 0 or shutil.which("ip") is None:
        return False
    probe = f"pslprobe{uuid.uuid4().hex[:6]}"
    ok = subprocess.run(["ip", "netns", "add", probe], capture_output=True).returncode == 0
    if ok:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return ok


def _ip(*args):
    p = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20)
    if p.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {p.stderr.strip()}")


class NetLab:
    def __init__(self, nodes):
        self.tag = f"psl{uuid.uuid4().hex[:5]}"
        self.fabric = f"{self.tag}-fab"
        self.ns = {}
        self.addr = {}
        self._veth = {}
        net = f"10.{random.randint(200, 250)}.{random.randint(0, 255)}"
        try:
            _ip("netns", "add", self.fabric)
            self.made = [self.fabric]
            _ip("-n", self.fabric, "link", "add", "br0", "type", "bridge")
            _ip("-n", self.fabric, "link", "set", "br0", "up")
            for k, node in enumerate(nodes):
                ns = f"{self.tag}-{node}"
                _ip("netns", "add", ns)
                self.made.append(ns)
                inner, outer = f"{self.tag}i{k}", f"{self.tag}o{k}"
                _ip("link", "add", inner, "netns", ns, "type", "veth", "peer", "name", outer,
                    "netns", self.fabric)
                _ip("-n", ns, "link", "set", "lo", "up")
                _ip("-n", ns, "addr", "add", f"{net}.{k + 2}/24", "dev", inner)
                _ip("-n", ns, "link", "set", inner, "up")
                _ip("-n", self.fabric, "link", "set", outer, "master", "br0")
                _ip("-n", self.fabric, "link", "set", outer, "up")
                self.ns[node], self.addr[node], self._veth[node] = ns, f"{net}.{k + 2}", outer
        except BaseException:
            self.close()
            raise

    def cut(self, node):
        _ip("-n", self.fabric, "link", "set", self._veth[node], "down")

    def heal(self, node):
        _ip("-n", self.fabric, "link", "set", self._veth[node], "up")

    def close(self):
        for ns in reversed(getattr(self, "made", [])):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=20)
        self.made = []

    def leftovers(self):
        out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        return [ln.split()[0] for ln in out.splitlines() if ln.startswith(self.tag)]
