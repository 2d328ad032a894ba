"""Serving: listening on a unix socket, several workers counting exactly,
header names in the JSON describe form (SPEC §3.2, §4). Overrides, shadow
routes and the IETF fields are in test_policy_features.py."""
import os
import socket
import subprocess

from conftest import wait_until
from helpers import avoid_hour_boundary  # noqa: F401  (autouse)
from helpers import BIN, hammer, policy, read_until_close, vcheck


def test_listen_unix_socket(tmp_path, redis_server):
    sock = os.path.join(str(tmp_path), "rl.sock")
    path = os.path.join(str(tmp_path), "unix.yaml")
    text = policy("  - name: u\n    match: {prefix: /}\n    key: global\n"
                  "    limits: [{name: w, algorithm: fixed_window, limit: 2, window: 1h}]\n")
    text = text.replace("127.0.0.1:{port}", "unix:" + sock)
    with open(path, "w") as f:
        f.write(text.format(redis_port=redis_server.port))
    log = open(os.path.join(str(tmp_path), "unix.log"), "wb")
    # systemd's unit runs it with UMask=0077: a gateway, another user, must
    # still be able to connect (write permission on the socket)
    proc = subprocess.Popen([BIN, "-c", path], stdout=log, stderr=log,
                            preexec_fn=lambda: os.umask(0o077))
    try:
        assert wait_until(lambda: os.path.exists(sock), timeout=5)
        assert wait_until(lambda: os.stat(sock).st_mode & 0o777 == 0o666, timeout=2), \
            oct(os.stat(sock).st_mode)

        def ask(req):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(3)
            s.connect(sock)
            s.sendall(req)
            out = read_until_close(s)
            s.close()
            return out
        assert wait_until(lambda: b" 200 " in ask(b"GET /readyz HTTP/1.0\r\n\r\n"), timeout=5)
        out = ask(b"GET /check/x HTTP/1.0\r\n\r\n")
        assert out.startswith(b"HTTP/1.") and b" 200 " in out.split(b"\r\n")[0]
        assert b"X-RateLimit-Remaining: 1" in out
        ask(b"GET /check/x HTTP/1.0\r\n\r\n")
        out = ask(b"GET /check/x HTTP/1.0\r\n\r\n")
        assert b" 429 " in out.split(b"\r\n")[0]
    finally:
        proc.terminate()
        rc = proc.wait(10)
        log.close()
    with open(os.path.join(str(tmp_path), "unix.log"), "rb") as f:
        text = f.read().decode("utf-8", "replace")
    assert rc == 0, "exit %d after SIGTERM; log:\n%s" % (rc, text)


def test_unix_socket_in_use_is_not_taken(tmp_path, redis_server):
    """A second daemon on the same socket path unlinked the first's socket
    and bound its own, silently taking the first's gateway away. A socket
    some process listens on is now refused; a stale one (its daemon
    killed) is still replaced, and a regular file is never removed."""
    sock = os.path.join(str(tmp_path), "rl.sock")
    path = os.path.join(str(tmp_path), "unix.yaml")
    text = policy("  - name: u\n    match: {prefix: /}\n    key: global\n"
                  "    limits: [{name: w, algorithm: fixed_window, limit: 9, window: 1h}]\n")
    with open(path, "w") as f:
        f.write(text.replace("127.0.0.1:{port}", "unix:" + sock).format(
            redis_port=redis_server.port))

    def start():
        return subprocess.Popen([BIN, "-c", path], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)

    def answers():
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(3)
        try:
            s.connect(sock)
            s.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
            return b" 200 " in read_until_close(s)
        except OSError:
            return False
        finally:
            s.close()
    first = start()
    try:
        assert wait_until(answers, timeout=5)
        second = start()
        out, err = second.communicate(timeout=10)
        assert second.returncode == 1, (second.returncode, err)
        assert ("listen unix:%s: another process is listening there" % sock) in \
            err.decode(), err
        assert answers()
    finally:
        first.kill()
        first.wait(10)
    assert os.path.exists(sock) and not answers()    # stale: its daemon died
    third = start()
    try:
        assert wait_until(answers, timeout=5)
    finally:
        third.terminate()
        assert third.wait(10) == 0
    # a daemon removes its socket at exit, but not one put there since
    first = start()
    assert wait_until(answers, timeout=5)
    os.unlink(sock)
    second = start()
    try:
        assert wait_until(answers, timeout=5)
        first.terminate()
        assert first.wait(10) == 0
        assert answers()
    finally:
        second.terminate()
        assert second.wait(10) == 0
    assert not os.path.exists(sock)
    # a socket it cannot connect to is said as it is, and left (a review)
    dgram = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    dgram.bind(sock)
    try:
        other = start()
        out, err = other.communicate(timeout=10)
        assert other.returncode == 1 and ("listen unix:%s: a socket is there, and "
                                          "connecting to it failed (" % sock) in err.decode(), err
        assert os.path.exists(sock)
    finally:
        dgram.close()
        os.unlink(sock)
    with open(sock, "w") as f:
        f.write("not a socket")
    fourth = start()
    assert fourth.wait(10) == 1
    with open(sock) as f:
        assert f.read() == "not a socket"


def test_two_workers_count_exactly(start_daemon):
    d = start_daemon(policy(
        "  - name: c\n    match: {prefix: /}\n    key: header:K\n"
        "    limits: [{name: q, algorithm: fixed_window, limit: 50, window: 1h}]\n",
        server="  workers: 2\n", timeout="2s"))
    res = hammer([(d.url("/check/x"), {"K": "w2"})] * 200, workers=100)
    statuses = [s for s, _ in res]
    assert statuses.count(200) == 50 and statuses.count(429) == 150, statuses
    assert sorted(int(rem) for s, rem in res if s == 200) == list(range(50))


def test_describe_form_header_names_case_insensitive(start_daemon):
    d = start_daemon(policy(
        "  - name: h\n    match: {prefix: /}\n    key: header:X-Api-Key\n"
        "    limits: [{name: q, algorithm: fixed_window, limit: 5, window: 1h}]\n"))
    v = vcheck(d, {"method": "GET", "path": "/x", "headers": {"x-api-key": "lower"}}).json()
    assert v["key"] == "lower" and v["remaining"] == 4
    v = vcheck(d, {"method": "GET", "path": "/x", "headers": {"X-API-KEY": "lower"}}).json()
    assert v["remaining"] == 3



def test_listen_ipv6_loopback_peer_is_trusted(tmp_path, redis_server):
    """Listening on [::1]: the peer ::1 is in the default trusted_proxies
    (::1/128), so its X-Forwarded-For names the client."""
    import requests
    from conftest import free_port
    from helpers import all_keys, rkey
    port = free_port()
    path = os.path.join(str(tmp_path), "v6.yaml")
    text = policy("  - name: six\n    match: {prefix: /}\n    key: ip\n"
                  "    limits: [{name: w, algorithm: fixed_window, limit: 2, window: 1h}]\n")
    text = text.replace("127.0.0.1:{port}", "'[::1]:%d'" % port)
    with open(path, "w") as f:
        f.write(text.format(redis_port=redis_server.port))
    log = open(os.path.join(str(tmp_path), "v6.log"), "wb")
    proc = subprocess.Popen([BIN, "-c", path], stdout=log, stderr=log)
    url = "http://[::1]:%d" % port
    try:
        assert wait_until(lambda: requests.get(url + "/readyz", timeout=1).ok, timeout=5)
        r = requests.get(url + "/check/x", headers={"X-Forwarded-For": "2001:db8::7"}, timeout=3)
        assert r.status_code == 200 and r.headers["X-RateLimit-Remaining"] == "1"
        r = requests.get(url + "/check/x", timeout=3)
        assert r.status_code == 200 and r.headers["X-RateLimit-Remaining"] == "1"
        assert all_keys(redis_server.client()) == {
            rkey("six", "2001:db8::7", "w", "fixed_window"),
            rkey("six", "::1", "w", "fixed_window")}
    finally:
        proc.terminate()
        rc = proc.wait(10)
        log.close()
    assert rc == 0


def test_listen_on_a_name_takes_its_ipv4_address(tmp_path, redis_server):
    """`listen: localhost:PORT` bound the first address the resolver gave,
    ::1 under a stock /etc/hosts, while the recipes and the Docker health
    check ask 127.0.0.1. Run with such a hosts file in a private mount
    namespace (skipped where unshare is not allowed)."""
    import shutil
    import time
    hosts = os.path.join(str(tmp_path), "hosts")
    with open(hosts, "w") as f:
        f.write("::1 localhost ip6-localhost\n127.0.0.1 localhost\n")
    probe = subprocess.run(["unshare", "-m", "sh", "-c",
                            'mount --bind "$0" /etc/hosts && getent ahosts localhost', hosts],
                           capture_output=True, text=True) if shutil.which("unshare") else None
    if probe is None or probe.returncode != 0 or not probe.stdout.startswith("::1"):
        import pytest
        pytest.skip("no private mount namespace here")
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    path = os.path.join(str(tmp_path), "p.yaml")
    with open(path, "w") as f:
        f.write("server: {listen: 'localhost:%d'}\nredis: {address: 127.0.0.1:%d}\n"
                "routes: []\n" % (port, redis_server.port))
    proc = subprocess.Popen(["unshare", "-m", "sh", "-c",
                             'mount --bind "$0" /etc/hosts && exec "$1" -c "$2"',
                             hosts, BIN, path],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def answers():
            try:
                s = socket.create_connection(("127.0.0.1", port), timeout=1)
            except OSError:
                return False
            s.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
            ok = b" 200 " in read_until_close(s)
            s.close()
            return ok
        assert wait_until(answers, timeout=10)
    finally:
        proc.terminate()
        assert proc.wait(10) == 0


def test_listening_beyond_loopback_is_said(start_daemon):
    """SPEC §8 has the daemon on loopback by default, and the README's
    trust in the forwarding headers rests on it: listening elsewhere starts,
    with a warning."""
    d = start_daemon(policy("  - name: u\n    match: {prefix: /}\n    key: global\n"
                            "    limits: [{name: w, algorithm: fixed_window, limit: 2, "
                            "window: 1h}]\n").replace("127.0.0.1:{port}", "0.0.0.0:{port}"))
    assert "listen 0.0.0.0:%d reaches beyond loopback: whoever can connect can ask " \
        "checks, and so charge any client's limits" % d.port in d.log(), d.log()
    e = start_daemon(policy("  - name: u\n    match: {prefix: /}\n    key: global\n"
                            "    limits: [{name: w, algorithm: fixed_window, limit: 2, "
                            "window: 1h}]\n"))
    assert "beyond loopback" not in e.log(), e.log()
