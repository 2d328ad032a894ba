"""Redis over TLS through conf/stunnel-redis.conf (README, "Redis over TLS"):
a redis-server that accepts only TLS, the shipped stunnel configuration
with only its names, ports and files filled in, and the daemon on the
tunnel's plain end. Limits hold, a Redis outage behind the tunnel fails
open and recovers, a certificate the tunnel does not trust keeps Redis
unreachable, and a daemon pointed at the TLS port itself says what is
likely wrong.

Skipped only when there is no stunnel or openssl binary (`make test`
installs both)."""
import os
import shutil
import subprocess
import time

import pytest
import redis
import requests

from conftest import Daemon, free_port, terminate_process, wait_until
from ops_helpers import fw, policy, route

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
STUNNEL = shutil.which("stunnel4") or shutil.which("stunnel")
OPENSSL = shutil.which("openssl")

pytestmark = pytest.mark.skipif(STUNNEL is None or OPENSSL is None,
                                reason="no stunnel or openssl binary")


def openssl(*args, cwd):
    subprocess.run([OPENSSL] + list(args), cwd=cwd, check=True, timeout=60,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def make_ca(d, ca):
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
            "-subj", "/CN=%s" % ca, "-keyout", ca + ".key", "-out", ca + ".crt", cwd=d)


def make_certs(d, ca="ca", server_name="localhost"):
    """A CA, and a server (server_name) and client certificate it signs."""
    make_ca(d, ca)
    for name, cn in (("server", server_name), ("client", "ratelimitd")):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=" + cn,
                "-keyout", name + ".key", "-out", name + ".csr", cwd=d)
        with open(os.path.join(d, name + ".ext"), "w") as f:
            f.write("subjectAltName=DNS:%s\n" % cn)
        openssl("x509", "-req", "-in", name + ".csr", "-CA", ca + ".crt", "-CAkey",
                ca + ".key", "-CAcreateserial", "-days", "2", "-extfile", name + ".ext",
                "-out", name + ".crt", cwd=d)


class TlsRedis:
    """redis-server with its plain port off: TLS on `port` only."""

    def __init__(self, d, port, mutual):
        self.d, self.port, self.mutual, self.proc = d, port, mutual, None

    def start(self):
        self.start_process()
        assert wait_until(self.ping, timeout=10), "TLS redis did not start"
        return self

    def start_process(self):
        p = lambda f: os.path.join(self.d, f)  # noqa: E731
        self.proc = subprocess.Popen(
            ["redis-server", "--port", "0", "--tls-port", str(self.port),
             "--bind", "127.0.0.1", "--tls-cert-file", p("server.crt"),
             "--tls-key-file", p("server.key"), "--tls-ca-cert-file", p("ca.crt"),
             "--tls-auth-clients", "yes" if self.mutual else "no",
             "--save", "", "--appendonly", "no", "--dir", self.d,
             "--logfile", p("redis.log")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def start_unchecked(self):
        """For a server certificate with another name: the test client
        checks names too, so wait for the port instead."""
        self.start_process()
        assert wait_until(lambda: port_open(self.port), timeout=10)
        return self

    def client(self):
        p = lambda f: os.path.join(self.d, f)  # noqa: E731
        return redis.Redis(host="localhost", port=self.port, ssl=True,
                           ssl_ca_certs=p("ca.crt"), ssl_certfile=p("client.crt"),
                           ssl_keyfile=p("client.key"), socket_timeout=2)

    def ping(self):
        try:
            return self.client().ping()
        except redis.RedisError:
            return False

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def stunnel_conf(d, accept, redis_port, mutual, cafile):
    """conf/stunnel-redis.conf with its placeholders filled in."""
    with open(os.path.join(ROOT, "conf", "stunnel-redis.conf")) as f:
        text = f.read()
    for old, new in (("accept = 127.0.0.1:6380", "accept = 127.0.0.1:%d" % accept),
                     ("connect = redis.example.com:6380", "connect = localhost:%d" % redis_port),
                     ("checkHost = redis.example.com", "checkHost = localhost"),
                     ("CAfile = /etc/ssl/certs/ca-certificates.crt", "CAfile = " + cafile),
                     (";cert = /etc/ratelimitd/redis-client.crt",
                      "cert = " + os.path.join(d, "client.crt") if mutual else ";"),
                     (";key = /etc/ratelimitd/redis-client.key",
                      "key = " + os.path.join(d, "client.key") if mutual else ";")):
        assert old in text, old
        text = text.replace(old, new)
    path = os.path.join(d, "stunnel.conf")
    with open(path, "w") as f:
        f.write(text)
    return path


@pytest.fixture
def tls_setup(tmp_path):
    """setup(mutual, trusted=True) -> (TlsRedis, tunnel port); torn down
    after the test."""
    procs = []
    d = str(tmp_path)

    def setup(mutual, trusted=True, server_name="localhost"):
        make_certs(d, server_name=server_name)
        if not trusted:
            make_ca(d, "other")             # a CA that signed nothing of theirs
        r = TlsRedis(d, free_port(), mutual)
        r.start() if server_name == "localhost" else r.start_unchecked()
        procs.append(r)
        accept = free_port()
        conf = stunnel_conf(d, accept, r.port, mutual,
                            os.path.join(d, "ca.crt" if trusted else "other.crt"))
        log = open(os.path.join(d, "stunnel.log"), "w")
        tunnel = subprocess.Popen([STUNNEL, conf], stdout=log, stderr=subprocess.STDOUT)
        procs.append(tunnel)
        assert wait_until(lambda: port_open(accept), timeout=10), open(
            os.path.join(d, "stunnel.log")).read()
        return r, accept
    yield setup
    for p in procs:
        if isinstance(p, TlsRedis):
            p.stop()
        else:
            terminate_process(p, timeout=5)


def port_open(port):
    import socket
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


@pytest.fixture
def daemon_on(tmp_path):
    started = []

    def start(redis_port):
        d = Daemon(tmp_path, redis_port, policy(route("api", "/api/", fw(3))))
        started.append(d)
        return d.start(wait_ready=False)
    yield start
    for d in started:
        assert d.stop() == 0, d.log()


def ready(d):
    return requests.get(d.url("/readyz"), timeout=2).status_code == 200


def hits(d, key, n):
    return [requests.get(d.url("/check/api/x"), headers={"X-Key": key},
                         timeout=2).status_code for _ in range(n)]


@pytest.mark.parametrize("mutual", [False, True], ids=["server-auth", "mutual-tls"])
def test_limits_hold_through_the_tunnel(tls_setup, daemon_on, mutual):
    r, tunnel = tls_setup(mutual)
    d = daemon_on(tunnel)
    assert wait_until(lambda: ready(d), timeout=10), d.log()
    assert hits(d, "k1", 4) == [200, 200, 200, 429]
    # The counters are in the TLS Redis.
    assert any(b"k1" in k for k in r.client().keys("*")), r.client().keys("*")

    # Redis gone behind the tunnel: failed open at once, then back.
    r.stop()
    t0 = time.monotonic()
    x = requests.get(d.url("/check/api/x"), headers={"X-Key": "k2"}, timeout=2)
    assert x.status_code == 200 and x.headers["X-RateLimit-Remaining"] == "-1"
    assert time.monotonic() - t0 < 0.5
    assert wait_until(lambda: not ready(d), timeout=5)
    r.start()
    assert wait_until(lambda: ready(d), timeout=5), d.log()
    assert hits(d, "k3", 4) == [200, 200, 200, 429]


def test_untrusted_certificate_keeps_redis_unreachable(tls_setup, daemon_on):
    """The tunnel refuses a server whose certificate its CAfile did not
    sign: the daemon never reaches Redis and says not ready; checks fail
    open (the default failure_mode)."""
    r, tunnel = tls_setup(False, trusted=False)
    d = daemon_on(tunnel)
    time.sleep(1.5)
    assert not ready(d)
    # The tunnel accepts, then closes once its own handshake fails: before
    # or after the daemon's connect completes, whichever the scheduler
    # makes it.
    assert ("closed by the server before the handshake finished" in d.log() or
            "connect failed: Connection reset by peer" in d.log()), d.log()
    x = requests.get(d.url("/check/api/x"), headers={"X-Key": "k"}, timeout=2)
    assert x.status_code == 200 and x.headers["X-RateLimit-Remaining"] == "-1"
    assert r.client().keys("*") == []


def test_daemon_on_the_tls_port_itself_says_why(tls_setup, daemon_on):
    r, _ = tls_setup(False)
    d = daemon_on(r.port)
    assert wait_until(lambda: "Redis over TLS" in d.log(), timeout=5), d.log()
    assert not ready(d)
    # said once per outage, not per reconnect attempt
    time.sleep(1.5)
    assert d.log().count("Redis over TLS") == 1, d.log()


def test_certificate_for_another_name_keeps_redis_unreachable(tls_setup, daemon_on, tmp_path):
    """checkHost: a certificate the trusted CA signed, but for another
    name, is refused by the tunnel as an impostor."""
    r, tunnel = tls_setup(False, server_name="evil.example")
    d = daemon_on(tunnel)
    time.sleep(1.5)
    assert not ready(d)
    x = requests.get(d.url("/check/api/x"), headers={"X-Key": "k"}, timeout=2)
    assert x.status_code == 200 and x.headers["X-RateLimit-Remaining"] == "-1"
    assert "Subject checks failed" in (tmp_path / "stunnel.log").read_text()
