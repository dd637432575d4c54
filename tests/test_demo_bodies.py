"""The demo server reads the JSON bodies that its own
printed hint (`curl -d '{...}'`, no JSON content-type) sends, rejects
unreadable ones with 4xx, and caps the body size.  A real demo server."""
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.timeout(150)


def post(base, path, body, ctype="application/x-www-form-urlencoded"):
    host, port = re.match(r"http://([^:]+):(\d+)", base).groups()
    c = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        headers = {"Content-Length": str(len(body))}
        if ctype:
            headers["Content-Type"] = ctype
        c.request("POST", path, body=body, headers=headers)
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def test_bodies_as_curl_sends_them(tmp_path):
    err = open(tmp_path / "stderr", "w+")
    proc = subprocess.Popen([sys.executable, "-m", "pyshmlock", "demo", "--workers", "2",
                             "--requests", "4", "--cycles", "10", "--keep-running"],
                            stdout=subprocess.PIPE, stderr=err, text=True, cwd="/")
    name = None
    try:
        text = ""
        deadline = time.monotonic() + 100
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            text += line
            if line.startswith("  workers:"):
                break
        hint = re.search(r"curl -s -XPOST (http://\S+)/generate -d '(.+)'", text)
        assert hint, text
        name = re.search(r"pyshmlock status (\S+)", text).group(1)
        base, body = hint.group(1), hint.group(2).encode()
        # The printed hint, byte for byte: curl -d sends a form content-type.
        status, out = post(base, "/generate", body)
        assert status == 200 and json.loads(out)["tokens"] == 5, out
        status, out = post(base, "/generate", b'{"max_tokens": 3}', ctype=None)
        assert status == 200 and json.loads(out)["tokens"] == 3, out
        status, out = post(base, "/pause_generation", b'{"mode": "abort"}')
        assert status == 200 and "drained" in json.loads(out), out   # abort, not in-place
        assert post(base, "/continue_generation", b"")[0] == 200
        # Unreadable bodies are 4xx, never silently ignored.
        assert post(base, "/generate", b"max_tokens=5")[0] == 400
        assert post(base, "/generate", b'{"max_tokens": 5', "application/json")[0] in (400, 422)
        assert post(base, "/generate", b"[5]")[0] == 422
        assert post(base, "/pause_generation", b'{"mode": "sideways"}')[0] == 422
        status, _ = post(base, "/generate", b'{"max_tokens": 5, "pad": "' + b"x" * (2 << 20)
                         + b'"}', "application/json")
        assert status == 413
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        proc.stdout.close()
        err.close()
    assert proc.returncode == 130
    assert name and not [f for f in os.listdir("/dev/shm") if name in f]
