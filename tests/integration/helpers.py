"""Helpers for the check-path integration tests (issue 2).

Policies are written here as plain YAML with the placeholders @PORT@ and
@REDIS_PORT@; `policy()` escapes the braces for conftest.Daemon, which runs
str.format on the text.
"""
import hashlib
import json
import os
import re
import socket
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from conftest import RedisServer, wait_until
from conftest import avoid_hour_boundary as conftest_avoid_hour_boundary

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.environ.get("RATELIMITD_BIN", os.path.join(ROOT, "build", "ratelimitd"))

RL_HEADERS = ("x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset",
              "retry-after")


def policy(routes, server="", redis="", top="", timeout="50ms"):
    """A whole policy file: `routes` is the YAML text under `routes:`
    (indented by two spaces), `server`/`redis` extra lines for those sections
    (indented by two spaces), `top` extra top-level lines."""
    text = (
        "server:\n"
        "  listen: 127.0.0.1:@PORT@\n"
        + server +
        "redis:\n"
        "  address: 127.0.0.1:@REDIS_PORT@\n"
        "  timeout: " + timeout + "\n"
        + redis
        + top +
        "routes:\n" + routes)
    return fmt(text)


def fmt(text):
    """Escape braces for str.format and turn @PORT@/@REDIS_PORT@ into
    the conftest placeholders."""
    return (text.replace("{", "{{").replace("}", "}}")
            .replace("@PORT@", "{port}").replace("@REDIS_PORT@", "{redis_port}"))


def client_part(raw):
    """The <client> part of a Redis key, per the contract."""
    if isinstance(raw, str):
        raw = raw.encode("utf-8")
    if len(raw) > 256:
        return "#" + hashlib.sha256(raw).hexdigest()
    out = []
    for b in raw:
        c = chr(b)
        if c.isascii() and (c.isalnum() or c in "._-"):
            out.append(c)
        else:
            out.append("%%%02X" % b)
    return "".join(out)


def rkey(route, client, limit, algorithm, prefix="rl:"):
    return "%s{%s:%s}:%s:%s" % (prefix, route, client_part(client), limit, algorithm)


def rkey_ip(route, ip, limit, algorithm, prefix="rl:"):
    """The key of a client identified by its IP on a route that also keys
    by a value the client sends: "ip=" marks it ('=' is always encoded in a
    value), so no header can spell its way onto an address's counter."""
    return "%s{%s:ip=%s}:%s:%s" % (prefix, route, client_part(ip), limit, algorithm)


def rkey_global(route, limit, algorithm, prefix="rl:"):
    return "%s{%s:*}:%s:%s" % (prefix, route, limit, algorithm)


def all_keys(r):
    """Every key in the selected DB, via SCAN, decoded (with the hex part of
    a hashed client folded to lower case so either case matches)."""
    keys = set()
    for k in r.scan_iter(count=1000):
        keys.add(norm_key(k.decode("utf-8", "surrogateescape")))
    return keys


def norm_key(k):
    i = k.find("{")
    j = k.find("}")
    if i >= 0 and j > i:
        inner = k[i + 1:j]
        colon = inner.rfind(":#")
        if colon >= 0:
            inner = inner[:colon + 2] + inner[colon + 2:].lower()
            k = k[:i + 1] + inner + k[j:]
    return k


def rl_headers(resp):
    return {h: resp.headers.get(h) for h in RL_HEADERS if h in resp.headers}


def has_rl_headers(resp):
    return any(h.lower().startswith("x-ratelimit") or h.lower() == "retry-after"
               for h in resp.headers)


def check(d, path="/check", method="GET", headers=None, timeout=5, **kw):
    return requests.request(method, d.url(path), headers=headers or {},
                            timeout=timeout, allow_redirects=False, **kw)


def vcheck(d, body, timeout=5):
    """POST /v1/check with a JSON body (dict) or raw bytes/str."""
    if isinstance(body, (dict, list)):
        data = json.dumps(body)
    else:
        data = body
    return requests.post(d.url("/v1/check"), data=data, timeout=timeout,
                         headers={"Content-Type": "application/json"})


def count_responses(buf):
    """How many complete HTTP responses (with Content-Length bodies) buf holds."""
    n = 0
    while True:
        i = buf.find(b"\r\n\r\n")
        if i < 0 or not buf.startswith(b"HTTP/"):
            return n
        head = buf[:i].decode("latin-1").lower()
        length = 0
        for line in head.split("\r\n")[1:]:
            if line.startswith("content-length:"):
                try:
                    length = int(line.split(":", 1)[1])
                except ValueError:
                    length = 0
        if len(buf) < i + 4 + length:
            return n
        n += 1
        buf = buf[i + 4 + length:]


def raw_http(port, data, timeout=3.0, expect=1):
    """Send raw bytes; read until the peer closes, `expect` complete
    responses have arrived, or `timeout`. Returns the bytes read."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        try:
            s.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass
        chunks = []
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            s.settimeout(max(0.01, end - time.monotonic()))
            try:
                b = s.recv(65536)
            except socket.timeout:
                break
            except ConnectionResetError:
                break
            if not b:
                break
            chunks.append(b)
            if expect and count_responses(b"".join(chunks)) >= expect:
                break
        return b"".join(chunks)
    finally:
        s.close()


# The release binary, for the tests that measure it (allocations, system
# calls): ASan's runtime would be measured with it.
RELEASE_BIN = os.path.join(ROOT, "build", "ratelimitd")
# One route keyed by header K: a key's first check is allowed through Redis
# ("tiny" allows one an hour), its next ones denied and then cached.
ONCE_POLICY = policy(
    "  - name: q\n    match: {prefix: /}\n    key: header:K\n"
    "    limits:\n"
    "      - {name: hourly, algorithm: fixed_window, limit: 100000, window: 1h}\n"
    "      - {name: tiny, algorithm: fixed_window, limit: 1, window: 1h}\n",
    timeout="2s")


def checks_over(socks, keys):
    """Sends one /check (header K: key) per key over the keep-alive
    connections `socks`, each request written once the previous reply on
    its connection is read; returns the statuses in key order."""
    statuses = []
    for i in range(0, len(keys), len(socks)):
        group = keys[i:i + len(socks)]
        for s, k in zip(socks, group):
            s.sendall(("GET /check HTTP/1.1\r\nHost: x\r\nX-Original-URI: /a\r\nK: %s\r\n\r\n"
                       % k).encode())
        for s in socks[:len(group)]:
            statuses.append(read_reply(s)[0])
    return statuses


def read_reply(sock):
    """(status, body) of the next reply on a keep-alive connection that
    has sent nothing past it."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))
    while len(body) < length:
        body += sock.recv(65536)
    return int(head.split(b" ", 2)[1]), body


def read_until_close(sock):
    """Everything the peer sends until it closes (or resets) the connection."""
    data = b""
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    except ConnectionResetError:
        pass
    return data


def status_of(raw):
    """Status code of the first response in raw bytes, or None."""
    if not raw.startswith(b"HTTP/"):
        return None
    try:
        return int(raw.split(b" ", 2)[1])
    except (IndexError, ValueError):
        return None


def healthy(d):
    r = requests.get(d.url("/healthz"), timeout=2)
    return r.status_code == 200 and r.text == "ok"


def validate(path, timeout=20):
    """Run `ratelimitd -t -c path`; returns CompletedProcess."""
    return subprocess.run([BIN, "-t", "-c", path], capture_output=True,
                          timeout=timeout)


class ArgsRedis(RedisServer):
    """A redis-server with extra command-line arguments (e.g. --requirepass)."""

    def __init__(self, tmpdir, extra=(), password=None, port=None):
        super().__init__(tmpdir, port=port)
        self.extra = list(extra)
        self.password = password

    def start(self):
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--dir", self.dir,
             "--logfile", os.path.join(self.dir, "redis-%d.log" % self.port)]
            + self.extra,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        assert wait_until(lambda: self.client().ping()), "redis did not start"
        return self

    def client(self, db=0):
        import redis
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=2,
                           password=self.password, db=db)


_local = threading.local()


def session():
    s = getattr(_local, "s", None)
    if s is None:
        s = _local.s = requests.Session()
    return s


def concurrently(one, jobs, workers=50):
    """one(job) for every job, from `workers` threads; the results in the
    order of the jobs."""
    with ThreadPoolExecutor(workers) as ex:
        return list(ex.map(one, jobs))


def hammer(urls_and_headers, workers=50):
    """GET each (url, headers) from `workers` threads, one Session per
    thread; returns [(status, X-RateLimit-Remaining)] in order."""
    def one(arg):
        url, headers = arg
        r = session().get(url, headers=headers, timeout=10)
        return r.status_code, r.headers.get("X-RateLimit-Remaining")
    return concurrently(one, urls_and_headers, workers)


def shared_daemon(tmp_path_factory, policy_text):
    """Generator for a module-scoped fixture: one redis-server and one daemon
    shared by the cases of a parametrized test that do not disturb each
    other. Yields (daemon, redis). At the end the daemon must still be alive
    and exit 0 on SIGTERM, as with conftest's start_daemon."""
    from conftest import Daemon
    tmp = tmp_path_factory.mktemp("shared")
    rs = RedisServer(tmp).start()
    d = Daemon(tmp, rs.port, policy_text)
    try:
        d.start()
        yield d, rs
        assert d.alive(), "daemon died:\n" + d.log()
        assert d.stop() == 0, "daemon exit code not 0:\n" + d.log()
    finally:
        if d.proc is not None and d.proc.poll() is None:
            d.proc.kill()
            d.proc.wait()
        rs.stop()


# Defined in conftest.py, for every module; the modules that import it from
# here by name still get the one fixture.
avoid_hour_boundary = conftest_avoid_hour_boundary
