"""The cluster gate over TLS with a private CA, mutual TLS (client
certificates) and etcd user authentication, end to end on real 3-member
etcds: the Python API, the agent and the CLI; and errors that say
"certificate" or "authentication" when that is the problem.  The
certificates are made here with openssl."""
import base64
import json
import os
import shutil
import subprocess
import sys
import urllib.request
import uuid

import pytest
from clusterlab import Host, stop_hosts

from pyshmlock_lab.cluster.localetcd import LocalEtcd, etcd_binary

if etcd_binary() is None or shutil.which("openssl") is None:
    if os.environ.get("PYSHMLOCK_REQUIRE_ETCD") == "1":
        raise RuntimeError("PYSHMLOCK_REQUIRE_ETCD=1 but etcd or openssl is not installed")
    pytest.skip("etcd or openssl is not installed", allow_module_level=True)

pytestmark = pytest.mark.timeout(120)


def _openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _cert(d, name, ca, cn, ext):
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out",
             f"{name}.csr", "-subj", f"/CN={cn}", cwd=d)
    with open(os.path.join(d, f"{name}.ext"), "w") as f:
        f.write(ext)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
             "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext",
             cwd=d)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("pki"))
    for ca in ("ca", "otherca"):
        _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{ca}.key",
                 "-out", f"{ca}.crt", "-days", "2", "-subj", f"/CN=pyshmlock test {ca}", cwd=d)
    _cert(d, "server", "ca", "etcd", "subjectAltName=IP:127.0.0.1\n"
          "extendedKeyUsage=serverAuth,clientAuth\n")
    _cert(d, "client", "ca", "fleet", "extendedKeyUsage=clientAuth\n")
    _cert(d, "stranger", "otherca", "fleet", "extendedKeyUsage=clientAuth\n")
    return {k: os.path.join(d, k) for k in
            ("ca.crt", "server.crt", "server.key", "client.crt", "client.key",
             "stranger.crt", "stranger.key")}


@pytest.fixture(scope="module")
def mtls_etcd(pki):
    e = LocalEtcd(members=3, tls={"cert": pki["server.crt"], "key": pki["server.key"],
                                  "ca": pki["ca.crt"], "client_cert_auth": True,
                                  "client_cert": pki["client.crt"],
                                  "client_key": pki["client.key"]})
    try:
        yield e
    finally:
        e.stop()


def _post(ep, path, body, token=None):
    req = urllib.request.Request(ep + "/v3" + path, data=json.dumps(body).encode(),
                                 method="POST", headers={"content-type": "application/json"})
    if token:
        req.add_header("Authorization", token)
    with urllib.request.urlopen(req, timeout=5) as r:
        return json.loads(r.read())


def _b64(s):
    return base64.b64encode(s.encode()).decode()


@pytest.fixture(scope="module")
def auth_etcd():
    """A 3-member etcd with authentication on: root, and a user 'fleet'
    allowed to read and write /pyshmlock/."""
    e = LocalEtcd(members=3)
    try:
        ep = e.endpoints[0]
        _post(ep, "/auth/role/add", {"name": "root"})
        _post(ep, "/auth/user/add", {"name": "root", "password": "rootpw"})
        _post(ep, "/auth/user/grant", {"user": "root", "role": "root"})
        _post(ep, "/auth/role/add", {"name": "fleet"})
        _post(ep, "/auth/role/grant", {"name": "fleet", "perm": {
            "permType": "READWRITE", "key": _b64("/pyshmlock/"), "range_end": _b64("/pyshmlock0")}})
        _post(ep, "/auth/user/add", {"name": "fleet", "password": "s3cret"})
        _post(ep, "/auth/user/grant", {"user": "fleet", "role": "fleet"})
        _post(ep, "/auth/enable", {})
        yield e
    finally:
        e.stop()


def _fleet_round(c, hosts):
    r = c.pause(timeout=20)
    assert r.acknowledged == sorted(h.id for h in hosts), r
    with c.update(timeout=20) as u:
        assert u.token > 0
    c.resume(timeout=10)
    for h in hosts:
        h.wait_admitting(15)


def test_private_ca_and_client_certificates(mtls_etcd, pki, tmp_path):
    from pyshmlock.cluster import CertificateError, Cluster
    name = f"tls-{uuid.uuid4().hex[:8]}"
    eps = mtls_etcd.endpoints
    # No CA: the server's certificate is not trusted, and the error says so.
    with Cluster(eps, name) as c, pytest.raises(CertificateError, match="certificate"):
        c.status(timeout=5)
    # The CA but no client certificate: etcd demands one.
    with Cluster(eps, name, ca=pki["ca.crt"]) as c, \
            pytest.raises(CertificateError, match="certificate"):
        c.status(timeout=5)
    # A client certificate from a CA etcd does not trust.
    with Cluster(eps, name, ca=pki["ca.crt"], cert=pki["stranger.crt"],
                 key=pki["stranger.key"]) as c, \
            pytest.raises(CertificateError, match="certificate"):
        c.status(timeout=5)
    # etcdctl's spelling (--cacert), which operators already type.
    tls = ["--cacert", pki["ca.crt"], "--cert", pki["client.crt"], "--key", pki["client.key"]]
    hs = [Host(eps, name, f"h{i}", str(tmp_path), workers=1, ttl=2, agent_args=tls)
          for i in range(2)]
    try:
        with Cluster(eps, name, ca=pki["ca.crt"], cert=pki["client.crt"],
                     key=pki["client.key"]) as c:
            c.wait_hosts(2, timeout=20)
            _fleet_round(c, hs)
        p = subprocess.run([sys.executable, "-m", "pyshmlock", "cluster", "status", "--etcd",
                            ",".join(eps), name] + tls, capture_output=True, text=True,
                           timeout=60)
        assert p.returncode == 0 and "h0" in p.stdout and "h1" in p.stdout, p.stderr
        p = subprocess.run([sys.executable, "-m", "pyshmlock", "cluster", "status", "--etcd",
                            ",".join(eps), name, "--ca", pki["ca.crt"]],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 1 and "certificate" in p.stderr, p.stderr
    finally:
        stop_hosts(hs)


def test_user_authentication(auth_etcd, tmp_path):
    from pyshmlock.cluster import AuthenticationError, Cluster
    name = f"auth-{uuid.uuid4().hex[:8]}"
    eps = auth_etcd.endpoints
    with Cluster(eps, name) as c, pytest.raises(AuthenticationError, match="authentication"):
        c.status(timeout=5)
    with Cluster(eps, name, user="fleet", password="wrong") as c, \
            pytest.raises(AuthenticationError, match="authentication"):
        c.status(timeout=5)
    hs = [Host(eps, name, f"h{i}", str(tmp_path), workers=1, ttl=2,
               agent_args=["--user", "fleet"], env={"PYSHMLOCK_ETCD_PASSWORD": "s3cret"})
          for i in range(2)]
    try:
        with Cluster(eps, name, user="fleet", password="s3cret") as c:
            c.wait_hosts(2, timeout=20)
            _fleet_round(c, hs)
        pw = tmp_path / "pw"
        pw.write_text("s3cret\n")
        run = lambda *a: subprocess.run(  # noqa: E731
            [sys.executable, "-m", "pyshmlock", "cluster", *a, "--etcd", ",".join(eps), name],
            capture_output=True, text=True, timeout=60)
        p = run("pause", "--user", "fleet", "--password-file", str(pw))
        assert p.returncode == 0 and "h0" in p.stdout, p.stderr
        p = run("resume", "--user", "fleet", "--password-file", str(pw))
        assert p.returncode == 0, p.stderr
        p = run("status")
        assert p.returncode == 1 and "authentication" in p.stderr, p.stderr
    finally:
        stop_hosts(hs)
