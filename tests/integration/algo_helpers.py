"""Helpers for the algorithm-through-the-daemon tests (issue 3).

Policies are written as plain YAML with @PORT@ / @REDIS_PORT@ placeholders;
`policy()` escapes the braces for conftest.Daemon, which runs str.format on
the text. Every route here matches the prefix /<name>/ and keys clients by
the X-Api-Key header, so `fa(d, "tb", "k1")` is one forward-auth check of
client k1 on route tb.

Time: the scripts take the time from Redis TIME, so the tests align and
schedule against the test's own Redis client (RedisClock), not a guess.
"""
import json
import threading
import time

import requests


def fmt(text):
    return (text.replace("{", "{{").replace("}", "}}")
            .replace("@PORT@", "{port}").replace("@REDIS_PORT@", "{redis_port}"))


def route(name, limits, extra=""):
    """One route: prefix /name/, key header:X-Api-Key, `limits` a list of
    YAML flow mappings (strings)."""
    text = ("  - name: %s\n    match: {prefix: /%s/}\n    key: header:X-Api-Key\n%s"
            "    limits:\n" % (name, name, extra))
    for l in limits:
        text += "      - %s\n" % l
    return text


def policy(routes, top=""):
    return fmt("server:\n  listen: 127.0.0.1:@PORT@\n"
               "redis:\n  address: 127.0.0.1:@REDIS_PORT@\n  timeout: 200ms\n"
               + top + "routes:\n" + "".join(routes))


def rkey(route_name, client, limit, algorithm):
    """The Redis key of a (route, client, limit); clients here are plain
    [A-Za-z0-9] so no percent-encoding is involved."""
    return "rl:{%s:%s}:%s:%s" % (route_name, client, limit, algorithm)


def fa(d, route_name, key, timeout=10):
    """Forward-auth check: GET /check with X-Original-URI and X-Api-Key."""
    return requests.get(d.url("/check"), timeout=timeout, allow_redirects=False,
                        headers={"X-Original-URI": "/%s/x" % route_name,
                                 "X-Api-Key": key})


def jc(d, route_name, key, cost=None, timeout=10):
    """JSON check by name: POST /v1/check {"route","key","cost"}."""
    body = {"route": route_name, "key": key}
    if cost is not None:
        body["cost"] = cost
    return requests.post(d.url("/v1/check"), data=json.dumps(body), timeout=timeout,
                         headers={"Content-Type": "application/json"})


def H(resp):
    """The rate-limit headers as ints (missing -> None)."""
    out = {}
    for name, k in (("X-RateLimit-Limit", "limit"), ("X-RateLimit-Remaining", "remaining"),
                    ("X-RateLimit-Reset", "reset"), ("Retry-After", "retry")):
        v = resp.headers.get(name)
        out[k] = int(v) if v is not None else None
    return out


def assert_denied(resp, route_name, status=429):
    """A forward-auth denial: status, Retry-After >= 1, the JSON body, and
    the body's retry_after equal to the header. Returns Retry-After."""
    assert resp.status_code == status, (resp.status_code, resp.text, dict(resp.headers))
    h = H(resp)
    assert h["retry"] is not None and h["retry"] >= 1, dict(resp.headers)
    assert resp.headers.get("Content-Type", "").startswith("application/json")
    body = resp.json()
    assert body == {"error": "rate_limited", "route": route_name,
                    "retry_after": h["retry"]}, body
    assert h["remaining"] is not None and h["remaining"] >= 0
    return h["retry"]


class RedisClock:
    """Redis TIME as float seconds, and sleeping until a Redis time. The
    offset to the local clock is measured once (the same host, so it is
    tiny, but the tests never assume it)."""

    def __init__(self, r):
        self.r = r
        best = None
        for _ in range(5):
            a = time.time()
            s, us = self.r.time()
            b = time.time()
            off = s + us / 1e6 - (a + b) / 2
            if best is None or b - a < best[0]:
                best = (b - a, off)
        self.offset = best[1]

    def now(self):
        s, us = self.r.time()
        return s + us / 1e6

    def local_now(self):
        return time.time() + self.offset

    def sleep_until(self, t):
        while True:
            left = t - self.local_now()
            if left <= 0:
                return
            time.sleep(min(left, 0.5))

    def align(self, period, phase, slack=0.03):
        """Sleep until Redis time mod period is `phase` (seconds into a
        window aligned like floor(now/period)). Returns the window start."""
        now = self.local_now()
        start = (now // period) * period
        target = start + phase
        if now > target - slack:
            start += period
            target += period
        self.sleep_until(target)
        return start

    def avoid_boundary(self, period, margin):
        """Make sure no aligned `period` boundary falls in the next `margin`
        seconds."""
        now = self.local_now()
        end = (now // period + 1) * period
        if end - now < margin:
            self.sleep_until(end + 0.05)


def parse_rat(s):
    """A stored exact time/value 'I' or 'I+R/D' (microseconds) as float."""
    if isinstance(s, bytes):
        s = s.decode()
    if "+" in s:
        i, rest = s.split("+")
        r, dd = rest.split("/")
        return int(i) + int(r) / int(dd)
    return float(s)


def concurrent(fns, start_delay=0.0):
    """Runs each fn in its own thread, released together. Returns
    (t0, [(fn result or exception, seconds from t0 to return)])."""
    n = len(fns)
    barrier = threading.Barrier(n + 1)
    out = [None] * n
    t0_box = []

    def run(i, fn):
        barrier.wait()
        try:
            res = fn()
        except Exception as e:  # reported to the test
            res = e
        out[i] = (res, time.monotonic())

    threads = [threading.Thread(target=run, args=(i, fn)) for i, fn in enumerate(fns)]
    for t in threads:
        t.start()
    time.sleep(start_delay)
    t0_box.append(time.monotonic())
    barrier.wait()
    return t0_box[0], threads, out


def join(threads, timeout=10):
    for t in threads:
        t.join(timeout)
        assert not t.is_alive(), "request thread hung"


def policy_limits(d):
    """{route name: [limit dicts]} from GET /v1/policy."""
    p = requests.get(d.url("/v1/policy"), timeout=2).json()
    return {r["name"]: r["limits"] for r in p["routes"]}


def snapshot(r, keys):
    """The full state of some keys (type-aware), to compare before/after."""
    out = {}
    for k in keys:
        t = r.type(k).decode()
        if t == "none":
            out[k] = None
        elif t == "string":
            out[k] = r.get(k)
        elif t == "hash":
            out[k] = r.hgetall(k)
        elif t == "zset":
            out[k] = r.zrange(k, 0, -1, withscores=True)
        else:
            out[k] = (t, "?")
    return out


class RawReply:
    def __init__(self, status, headers, body, t):
        self.status_code, self.headers, self.text, self.t = status, headers, body, t

    def json(self):
        return json.loads(self.text)


def fire(port, route_name, key, n, timeout=5.0):
    """Sends n forward-auth checks at once on n pre-opened connections from
    one thread, and timestamps each reply as it arrives (no thread
    scheduling in the measurement). Returns (t0, [RawReply in send order])
    with t the monotonic arrival time."""
    import select
    import socket
    req = ("GET /check HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Original-URI: /%s/x\r\n"
           "X-Api-Key: %s\r\nConnection: close\r\n\r\n" % (route_name, key)).encode()
    socks = [socket.create_connection(("127.0.0.1", port), timeout=timeout) for _ in range(n)]
    bufs = [b""] * n
    done = [None] * n
    t0 = time.monotonic()
    for s in socks:
        s.sendall(req)
    for s in socks:
        s.setblocking(False)
    end = t0 + timeout
    try:
        while any(x is None for x in done) and time.monotonic() < end:
            live = [s for i, s in enumerate(socks) if done[i] is None]
            rd, _, _ = select.select(live, [], [], 0.005)
            now = time.monotonic()
            for s in rd:
                i = socks.index(s)
                chunk = s.recv(65536)
                bufs[i] += chunk
                parsed = _parse_reply(bufs[i], closed=not chunk)
                if parsed is not None:
                    done[i] = RawReply(*parsed, t=now)
    finally:
        for s in socks:
            s.close()
    assert all(x is not None for x in done), "replies missing: %r" % bufs
    return t0, done


def _parse_reply(buf, closed):
    i = buf.find(b"\r\n\r\n")
    if i < 0:
        return None
    lines = buf[:i].decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = requests.structures.CaseInsensitiveDict()
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip()] = v.strip()
    body = buf[i + 4:]
    length = headers.get("Content-Length")
    if length is not None:
        if len(body) < int(length):
            return None
        body = body[:int(length)]
    elif not closed:
        return None
    return status, headers, body.decode("utf-8", "replace")
