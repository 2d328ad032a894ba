"""Malformed HTTP and hostile input never take the daemon down (SPEC §3.3, §8).
After every attack the daemon must still answer /healthz and count right."""
import email.utils
import json
import os
import select
import signal
import socket
import time

import pytest
import requests

from conftest import all_stopped, open_files, wait_until
from helpers import avoid_hour_boundary  # noqa: F401  (autouse)
from helpers import all_keys, check, healthy, policy, raw_http, shared_daemon, status_of

POL = policy(
    "  - name: r\n    match: {prefix: /}\n    key: [header:X-Api-Key, ip]\n"
    "    limits: [{name: q, algorithm: fixed_window, limit: 5, window: 1h}]\n")


def still_counts(d, key):
    r = check(d, "/check/x", "GET", {"X-Api-Key": key})
    return r.status_code == 200 and r.headers["X-RateLimit-Remaining"] == "4"


GARBAGE = [
    b"GARBAGE\r\n\r\n",
    b"\x00\x01\x02\x03\xff\xfe\r\n\r\n",
    b"GET\r\n\r\n",
    b"GET /check\r\n\r\n",
    b"GET /check HTTP/9.9\r\n\r\n",
    b"GET /check HTTP/1.1 extra\r\n\r\n",
    b"GET  HTTP/1.1\r\nHost: x\r\n\r\n",
    b"\r\n\r\n\r\n",
    b"GET /check HTTP/1.1\r\nNoColonHeader\r\n\r\n",
    b"GET /check HTTP/1.1\r\n: empty-name\r\n\r\n",
    b"GET /check HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
    b"GET /check HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999\r\n\r\n",
    b"POST /v1/check HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    b"POST /v1/check HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"fffffffffffffff\r\n{}\r\n0\r\n\r\n",
    b"GET /check/%zz%00%ff HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /check HTTP/1.1\r\nHost: x\r\nX-Original-URI: \xff\xfe\x00/\r\n\r\n",
    b"GET /check HTTP/1.1\r\nHost: x\r\nX-Original-Method: \xc3\x28\r\n\r\n",
    b"GET /check HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: \xff, ::::, 999.1.1.1, \r\n\r\n",
    b"GET /check HTTP/1.1\r\nHost: x\r\nX-Real-IP: not-an-ip\r\n\r\n",
    b"GET /check HTTP/1.1\r\nHost: x\r\nCookie: ;;;=;==; sid\r\n\r\n",
    b"GET /check HTTP/1.1\r\nHost: x\r\nX-Original-URI: ?&&==&k\r\n\r\n",
    b"GET /check HTTP/1.1\r\nHost: x\r\nX-Original-URI: \r\n\r\n",
    b"GET /check HTTP/1.1\r\nHost: x\r\nX-Original-URI: " + b"/a" * 6000 + b"\r\n\r\n",
    b"GET /check HTTP/1.1\r\n" + b"X-H: v\r\n" * 1500 + b"\r\n",
    b"GET /check HTTP/1.1\r\nHost: x\r\nX-Api-Key: a\x00b\r\n\r\n",
    b"GET /check HTTP/1.1\r\nHost: x\r\n\tfolded\r\n\r\n",
    b"GET /check HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: " + b"10.0.0.1, " * 1200 + b"\r\n\r\n",
    b"GET /check HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: " + b"," * 8000 + b"\r\n\r\n",
]


@pytest.fixture(scope="module")
def garbage_daemon(tmp_path_factory):
    yield from shared_daemon(tmp_path_factory, POL)


@pytest.mark.parametrize("i", range(len(GARBAGE)))
def test_garbage_requests(garbage_daemon, i):
    d = garbage_daemon[0]
    out = raw_http(d.port, GARBAGE[i], timeout=2)
    st = status_of(out)
    # 4xx for bad input (505 is the right answer to an unknown HTTP version);
    # never a 5xx that a gateway would read as "the sidecar is broken"
    assert st is None or st < 500 or st == 505, out[:200]
    assert healthy(d)
    assert still_counts(d, "after-%d" % i)


# Each refusal of the request head, with the status and the reason its body
# gives: a gateway's log shows that body, and it is all the operator has.
REFUSED_HEADS = [
    (b"GET /check HTTPS/1.1\r\nHost: x\r\n\r\n", 400, b"malformed request line"),
    (b"G(T /check HTTP/1.1\r\nHost: x\r\n\r\n", 400, b"malformed method"),
    (b"GET /che\x01ck HTTP/1.1\r\nHost: x\r\n\r\n", 400, b"malformed request target"),
    (b"GET /check HTTP/1.1\r\nHost: x\r\nX Api-Key: k\r\n\r\n", 400,
     b"malformed header name"),
    (b"GET /check HTTP/1.1\r\nHost: x\r\nX-Api-Key: a\rb\r\n\r\n", 400,
     b"bare CR in a header value"),
    (b"POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Length:\r\n\r\n", 400,
     b"malformed Content-Length"),
    (b"POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Length: 1e3\r\n\r\n", 400,
     b"malformed Content-Length"),
    (b"GET /check HTTP/2.0\r\nHost: x\r\n\r\n", 505, b"unsupported HTTP version"),
    (b"GET /check HTTP/1.10\r\nHost: x\r\n\r\n", 505, b"unsupported HTTP version"),
    # lines ended by CR alone: the head never ends, and was left to
    # idle_timeout (an audit); nginx answers 400 at once
    (b"GET /check HTTP/1.1\rHost: x\r\r", 400, b"bare CR in the request head"),
]


@pytest.mark.parametrize("raw,status,says", REFUSED_HEADS,
                         ids=["version-name", "method-char", "target-control",
                              "header-name-space", "bare-cr", "empty-length",
                              "float-length", "http2", "two-digit-minor",
                              "cr-line-ends"])
def test_refused_heads_say_why(garbage_daemon, request, raw, status, says):
    d = garbage_daemon[0]
    out = raw_http(d.port, raw, timeout=2)
    assert status_of(out) == status, out[:200]
    assert says in out.split(b"\r\n\r\n", 1)[1], out[:300]
    assert b"\r\nConnection: close\r\n" in out, out[:300]
    assert healthy(d)
    assert still_counts(d, "after-" + request.node.callspec.id)


def test_a_later_http_1_minor_is_served_as_1_1(start_daemon):
    """RFC 9112 2.3: a server answers a higher minor version as the
    highest it speaks; nginx serves HTTP/1.2 as 1.1. It got a 505 (an
    audit). As 1.1: its Host is required, and the connection kept."""
    d = start_daemon(POL)
    out = raw_http(d.port, b"GET /check/x HTTP/1.2\r\nHost: x\r\n\r\n"
                   b"GET /check/x HTTP/1.9\r\nHost: x\r\nConnection: close\r\n\r\n",
                   expect=2)
    assert out.count(b"HTTP/1.1 200 OK\r\n") == 2, out
    assert status_of(raw_http(d.port, b"GET /check/x HTTP/1.2\r\n\r\n")) == 400


def test_many_garbage_requests_in_a_row(start_daemon):
    d = start_daemon(POL)
    for data in GARBAGE * 2:
        raw_http(d.port, data, timeout=0.5)
    assert healthy(d)
    assert still_counts(d, "after-all")


def test_invalid_utf8_headers_answered(start_daemon, redis_server):
    d = start_daemon(POL)
    out = raw_http(d.port, b"GET /check/x HTTP/1.1\r\nHost: x\r\nX-Api-Key: \xc3\x28\xa0\xa1\r\n"
                   b"Connection: close\r\n\r\n")
    assert status_of(out) == 200, out[:300]
    assert b"X-RateLimit-Remaining: 4" in out
    assert "rl:{r:%C3%28%A0%A1}:q:fixed_window" in all_keys(redis_server.client())
    assert healthy(d)


@pytest.mark.parametrize("size", [17 * 1024, 64 * 1024, 1024 * 1024])
def test_huge_headers_rejected(start_daemon, size):
    d = start_daemon(POL)
    req = (b"GET /check/x HTTP/1.1\r\nHost: x\r\nX-Api-Key: big\r\nX-Big: " + b"a" * size
           + b"\r\nConnection: close\r\n\r\n")
    try:
        out = raw_http(d.port, req, timeout=3)
    except (BrokenPipeError, ConnectionResetError):
        out = b""
    assert status_of(out) in (400, 413, 431), out[:200]
    assert healthy(d)
    # the rejected request was not counted
    r = check(d, "/check/x", "GET", {"X-Api-Key": "big"})
    assert r.headers["X-RateLimit-Remaining"] == "4"


def test_many_small_header_fields_accepted(start_daemon):
    """SPEC limits the head by size (16 KiB), not by field count: nginx
    adds its own fields to the client's, and a client's 95 small headers
    must not turn into a 431 (a 500 from auth_request). The key is the
    last field, far past the fields kept in the connection itself."""
    d = start_daemon(POL)
    for n in (95, 1200):
        head = b"".join(b"X-H-%d: v\r\n" % i for i in range(n))
        assert len(head) < 16 * 1024 - 200
        req = (b"GET /check/x HTTP/1.1\r\nHost: x\r\n" + head
               + b"X-Api-Key: many-%d\r\nConnection: close\r\n\r\n" % n)
        out = raw_http(d.port, req, timeout=3)
        assert status_of(out) == 200, out[:200]
        assert b"X-RateLimit-Remaining: 4" in out
        assert still_counts_after(d, "many-%d" % n)
    assert healthy(d)


def test_absolute_form_targets(start_daemon):
    """RFC 9112: a server must accept http://host/path as the target."""
    d = start_daemon(POL)
    for target, status in ((b"http://127.0.0.1/check/x", 200),
                           (b"HTTP://sidecar:8080/healthz", 200),
                           (b"https://h/v1/policy", 200),
                           (b"http://h", 404), (b"http://h/nope", 404)):
        out = raw_http(d.port, b"GET " + target + b" HTTP/1.1\r\nHost: h\r\n"
                       b"X-Api-Key: absolute\r\nConnection: close\r\n\r\n")
        assert status_of(out) == status, (target, out[:200])
    assert still_counts_after(d, "absolute")


def still_counts_after(d, key):
    r = check(d, "/check/x", "GET", {"X-Api-Key": key})
    return r.status_code == 200 and r.headers["X-RateLimit-Remaining"] == "3"


def test_huge_request_line_rejected(start_daemon):
    d = start_daemon(POL)
    req = b"GET /check/" + b"a" * (20 * 1024) + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    try:
        out = raw_http(d.port, req, timeout=3)
    except (BrokenPipeError, ConnectionResetError):
        out = b""
    assert status_of(out) in (400, 413, 414, 431), out[:200]
    assert healthy(d)


def test_many_headers_under_limit_accepted(start_daemon):
    d = start_daemon(POL)
    h = {"X-Api-Key": "many"}
    h.update({"X-Pad-%d" % i: "v" * 150 for i in range(60)})   # ~10 KiB in 65 headers
    r = check(d, "/check/x", "GET", h)
    assert r.status_code == 200 and r.headers["X-RateLimit-Remaining"] == "4"


def test_half_requests_and_abrupt_closes(start_daemon):
    d = start_daemon(POL)
    for data in (b"GET /check/x HTTP/1.1\r\nHost:", b"POST /v1/check HTTP/1.1\r\n"
                 b"Content-Length: 100\r\n\r\n{\"route\":", b"G"):
        for _ in range(10):
            s = socket.create_connection(("127.0.0.1", d.port))
            s.sendall(data)
            s.close()
    # reset (RST) instead of FIN
    for _ in range(10):
        s = socket.create_connection(("127.0.0.1", d.port))
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        s.sendall(b"GET /check/x HTTP/1.1\r\nHost: x\r\n\r\n")
        s.close()
    time.sleep(0.2)
    assert healthy(d)
    assert still_counts(d, "after-abort")


def test_pipelined_requests(start_daemon):
    d = start_daemon(POL)
    req = b"GET /check/x HTTP/1.1\r\nHost: x\r\nX-Api-Key: pipe\r\n\r\n"
    last = b"GET /check/x HTTP/1.1\r\nHost: x\r\nX-Api-Key: pipe\r\nConnection: close\r\n\r\n"
    out = raw_http(d.port, req * 2 + last, timeout=3, expect=3)
    assert out.count(b"HTTP/1.1 200") == 3, out
    for n in (4, 3, 2):
        assert b"X-RateLimit-Remaining: %d\r\n" % n in out


def test_http10_request(start_daemon):
    """A 1.0 request is answered in the version the server speaks, as
    nginx does (RFC 9110 2.5)."""
    d = start_daemon(POL)
    out = raw_http(d.port, b"GET /check/x HTTP/1.0\r\nX-Api-Key: h10\r\n\r\n", timeout=3)
    assert out.startswith(b"HTTP/1.1 200 OK\r\n"), out
    assert b"X-RateLimit-Remaining: 4" in out


def test_empty_lines_before_a_request_are_skipped(start_daemon):
    """RFC 9112 2.2 (and nginx): empty lines before the request line are
    ignored, as after a body some clients add; two made a 400."""
    d = start_daemon(POL)
    req = b"GET /check/x HTTP/1.1\r\nHost: x\r\nX-Api-Key: blank\r\n\r\n"
    out = raw_http(d.port, b"\r\n\r\n\n" + req + b"\r\n\r\n" + req.replace(
        b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n"), timeout=3, expect=2)
    assert out.count(b"HTTP/1.1 200 OK") == 2, out


def new_connection_answered_s(d):
    """Seconds a new connection waits for its first reply."""
    t0 = time.monotonic()
    with socket.create_connection(("127.0.0.1", d.port), timeout=3) as n:
        n.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert n.recv(1000).startswith(b"HTTP/1.1 200 OK")
    return time.monotonic() - t0


@pytest.mark.parametrize("after_body", [b"", b"\r\n"])
def test_an_idle_connection_at_the_cap_makes_room(start_daemon, after_body):
    """At the cap, a connection that turned idle after its reply made no
    room: the worker had stopped accepting, so a new connection waited in
    the backlog for the idle one's timeout (30 s here). And the CRLF some
    clients send after a body stayed in the buffer, so such a connection
    never counted as idle (both found by a review)."""
    d = start_daemon(POL.replace("server:\n", "server:\n  max_connections: 1\n"
                                 "  idle_timeout: 30s\n"))
    s = socket.create_connection(("127.0.0.1", d.port), timeout=3)
    try:
        body = b'{"route":"r","key":"crlf"}'
        s.sendall(b"POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
                  % len(body) + body + after_body)
        assert s.recv(65536).startswith(b"HTTP/1.1 ")
        time.sleep(0.05)
        assert new_connection_answered_s(d) < 1.0
    finally:
        s.close()


def test_an_idle_connection_reopening_accepting_keeps_the_cap(start_daemon):
    """From a review of the fix above: a connection settling idle re-opened
    accepting even when the worker already held one over its share, so a
    client going busy, a silent connection arriving, the client going idle
    again, took the worker one further each round (41 open at cap 1)."""
    d = start_daemon(POL.replace("server:\n", "server:\n  max_connections: 1\n"
                                 "  idle_timeout: 30s\n"))
    before = settled_sockets(d)
    body = b'{"route":"r","key":"cap"}'
    head = b"POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body)
    a = socket.create_connection(("127.0.0.1", d.port), timeout=3)
    silent, held = [], []
    try:
        a.sendall(head + body)
        assert a.recv(65536).startswith(b"HTTP/1.1 ")
        for _ in range(8):
            a.sendall(head + body[:5])              # busy: half a request
            time.sleep(0.05)
            silent.append(socket.create_connection(("127.0.0.1", d.port), timeout=3))
            time.sleep(0.05)
            a.sendall(body[5:])                     # answered, then idle
            out = a.recv(65536)
            assert out.startswith(b"HTTP/1.1 "), out
            time.sleep(0.05)
            held.append(daemon_sockets(d) - before)
            if b"Connection: close" in out:
                break       # at the cap with one waiting: as the README says
        assert max(held) <= 2, held                 # the share, and one making room
    finally:
        a.close()
        for s in silent:
            s.close()


def test_empty_lines_do_not_keep_a_connection_open(start_daemon):
    """Empty lines are dropped before a request, so they restarted the idle
    clock: a client sending one a second outlived idle_timeout forever,
    and enough of them shut a worker out (found by a review)."""
    d = start_daemon(POL.replace("server:\n", "server:\n  idle_timeout: 1s\n"))
    s = socket.create_connection(("127.0.0.1", d.port), timeout=5)
    try:
        t0 = time.monotonic()
        closed = False
        while time.monotonic() - t0 < 4 and not closed:
            try:
                s.sendall(b"\r\n")
            except OSError:
                closed = True
                break
            s.settimeout(0.4)
            try:
                closed = s.recv(100) == b""
            except socket.timeout:
                pass
            except OSError:
                closed = True
        assert closed and time.monotonic() - t0 < 2.5, time.monotonic() - t0
    finally:
        s.close()


def test_http11_without_host_is_400(start_daemon):
    """RFC 9112 3.2 (and nginx): a 1.1 request must name its host; a 1.0
    one need not."""
    d = start_daemon(POL)
    out = raw_http(d.port, b"GET /check/x HTTP/1.1\r\nX-Api-Key: nohost\r\n\r\n", timeout=3)
    assert status_of(out) == 400 and b"without a Host" in out, out
    out = raw_http(d.port, b"GET /check/x HTTP/1.0\r\nX-Api-Key: nohost\r\n\r\n", timeout=3)
    assert status_of(out) == 200, out


def test_every_reply_is_dated(start_daemon):
    """RFC 9110 6.6.1: a server with a clock sends Date, on replies from
    the handler and on protocol errors alike."""
    d = start_daemon(POL)
    for req in (b"GET /check/x HTTP/1.1\r\nHost: x\r\nX-Api-Key: dated\r\n\r\n",
                b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n",
                b"GET /nowhere HTTP/1.1\r\nHost: x\r\n\r\n",
                b"GET /healthz HTTP/1.1\r\n\r\n", b"BAD\r\n\r\n"):
        before = time.time()
        out = raw_http(d.port, req, timeout=3)
        after = time.time()
        head = out.split(b"\r\n\r\n", 1)[0].decode()
        dates = [l[6:] for l in head.split("\r\n") if l.lower().startswith("date: ")]
        assert len(dates) == 1, head
        stamp = email.utils.parsedate_to_datetime(dates[0])
        assert dates[0].endswith(" GMT") and len(dates[0]) == 29, dates
        assert int(before) - 1 <= stamp.timestamp() <= after + 1, (dates, before)


def test_bad_json_then_healthy(start_daemon):
    d = start_daemon(POL)
    for body in (b"{", b"\x00" * 1000, b'{"route":"r","key":"\xff"}', b'{"route":' * 5000,
                 b'{"route":"r","key":"k","cost":1e400}', b'{"a":"\\ud800"}'):
        r = requests.post(d.url("/v1/check"), data=body, timeout=5)
        assert r.status_code == 400, (body[:40], r.status_code)
    assert healthy(d)
    assert still_counts(d, "after-json")


def test_idle_connections_do_not_block_others(start_daemon):
    d = start_daemon(POL)
    idle = [socket.create_connection(("127.0.0.1", d.port)) for _ in range(50)]
    try:
        for s in idle[:25]:
            s.sendall(b"GET /check/x HTTP/1.1\r\n")   # never finished
        t0 = time.monotonic()
        assert still_counts(d, "idle")
        assert time.monotonic() - t0 < 1.0
    finally:
        for s in idle:
            s.close()


def test_idle_timeout_closes_connection(start_daemon):
    d = start_daemon(POL.replace("server:\n", "server:\n  idle_timeout: 1s\n", 1))
    s = socket.create_connection(("127.0.0.1", d.port), timeout=5)
    try:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        first = s.recv(65536)
        assert first.startswith(b"HTTP/1.1 200")
        t0 = time.monotonic()
        rest = s.recv(65536)       # blocks until the daemon closes the idle connection
        waited = time.monotonic() - t0
        assert rest == b""
        assert 0.5 < waited < 3.5, waited
    finally:
        s.close()
    assert healthy(d)


def test_a_slow_reader_taking_its_replies_is_not_idle(start_daemon):
    """A client that pipelined 2,000 requests and read the replies at its
    own pace was reset at idle_timeout, most of them unsent (an audit: 142
    of 2,000 at 20 s), as the socket's buffers held megabytes and no reply
    was made while they drained. Like nginx's send_timeout, the timer now
    counts from the last progress: at 300 KB/s the link outlives several
    idle_timeouts."""
    d = start_daemon(POL.replace("server:\n", "server:\n  idle_timeout: 1s\n", 1))
    s = socket.create_connection(("127.0.0.1", d.port), timeout=5)
    try:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" * 2000)
        got, t0 = 0, time.monotonic()
        while time.monotonic() - t0 < 4:
            chunk = s.recv(30000)
            assert chunk, "closed after %.1f s, %d bytes" % (time.monotonic() - t0, got)
            got += len(chunk)
            time.sleep(0.1)
        assert got > 500000, got
    finally:
        s.close()
    assert healthy(d)


def test_conflicting_content_lengths_rejected(start_daemon, redis_server):
    """RFC 9112 §6.3: differing Content-Length values are an unrecoverable
    error (a request-smuggling vector); the request must not be processed."""
    d = start_daemon(POL)
    body = b'{"route":"r","key":"smuggle"}'
    out = raw_http(d.port, b"POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n"
                   b"Content-Length: 3\r\n\r\n%s" % (len(body), body), timeout=2)
    assert status_of(out) == 400, out[:200]
    assert all_keys(redis_server.client()) == set()
    assert healthy(d)


def test_partial_request_head_times_out(start_daemon):
    """A client that never finishes its request head (slowloris) is closed
    after server.idle_timeout."""
    d = start_daemon(POL.replace("server:\n", "server:\n  idle_timeout: 1s\n", 1))
    s = socket.create_connection(("127.0.0.1", d.port), timeout=6)
    try:
        s.sendall(b"GET /check/x HTTP/1.1\r\nHost: x\r\n")
        t0 = time.monotonic()
        for _ in range(3):                      # trickle a byte now and then
            time.sleep(0.3)
            try:
                s.sendall(b"X")
            except OSError:
                break
        try:
            rest = s.recv(65536)
            while rest and not rest.endswith(b"}") and b"\r\n\r\n" not in rest:
                rest += s.recv(65536)
        except (ConnectionResetError, socket.timeout):
            rest = b""
        waited = time.monotonic() - t0
        st = status_of(rest)
        assert st is None or 400 <= st < 500, rest[:200]
        assert waited < 5, waited
    finally:
        s.close()
    assert healthy(d)


@pytest.mark.parametrize("first_bytes", [
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"A" * 100,  # TLS ClientHello
    b" GET /healthz",                                               # line starts with a space
    b"GE\x00T /healthz",
    b"GET\t/healthz",
], ids=["tls-client-hello", "leading-space", "nul", "tab"])
def test_bytes_no_method_can_start_are_refused_at_once(start_daemon, first_bytes):
    """A gateway set up to speak TLS to the sidecar sends a handshake with
    no line end: nginx answers it 400 at once, and so does the daemon,
    rather than holding it for idle_timeout (60 s by default)."""
    d = start_daemon(POL)
    s = socket.create_connection(("127.0.0.1", d.port), timeout=5)
    try:
        s.sendall(first_bytes)
        t0 = time.monotonic()
        out = s.recv(65536)
        waited = time.monotonic() - t0
    finally:
        s.close()
    assert status_of(out) == 400 and b"malformed method" in out, out[:200]
    assert waited < 2, waited
    # A method arriving a byte at a time is not refused before its space.
    s = socket.create_connection(("127.0.0.1", d.port), timeout=5)
    try:
        for ch in b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n":
            s.sendall(bytes([ch]))
            time.sleep(0.002)
        out = s.recv(65536)
    finally:
        s.close()
    assert status_of(out) == 200, out[:200]
    assert healthy(d)


def test_trickled_request_head_gets_idle_timeout_in_all(start_daemon):
    """Slowloris proper: a byte every 100 ms, each well inside
    idle_timeout. The head must be complete within idle_timeout of its
    first byte; the daemon closes the connection then, not 16 KiB later."""
    d = start_daemon(POL.replace("server:\n", "server:\n  idle_timeout: 1s\n", 1))
    s = socket.create_connection(("127.0.0.1", d.port), timeout=6)
    try:
        t0 = time.monotonic()
        s.sendall(b"GET /check/x HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        closed_after = None
        while time.monotonic() - t0 < 4:
            time.sleep(0.1)
            try:
                s.sendall(b"z")
                s.setblocking(False)
                try:
                    if s.recv(65536) == b"":
                        closed_after = time.monotonic() - t0
                        break
                except BlockingIOError:
                    pass
                finally:
                    s.setblocking(True)
            except OSError:
                closed_after = time.monotonic() - t0
                break
        assert closed_after is not None, "still open after 4 s of trickling"
        assert closed_after < 2.5, closed_after
    finally:
        s.close()
    assert healthy(d)


def test_file_descriptor_exhaustion(start_daemon):
    """With its fd limit lowered to 64, 150 connections at once must not take
    the daemon down; once they close it serves again."""
    import subprocess
    d = start_daemon(POL)
    subprocess.run(["prlimit", "--pid", str(d.proc.pid), "--nofile=64:64"], check=True)
    conns = []
    try:
        for _ in range(150):
            try:
                conns.append(socket.create_connection(("127.0.0.1", d.port), timeout=1))
            except OSError:
                break
        for s in conns[:50]:
            try:
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            except OSError:
                pass
        time.sleep(1.0)
    finally:
        for s in conns:
            s.close()
    assert wait_until_healthy(d, 3), d.log()[-2000:]
    assert still_counts(d, "after-emfile")
    # A pause every 100 ms, said once (then once every 10 s with a count).
    assert d.log().count("accept: Too many open files") == 1, d.log()[-2000:]


def wait_until_healthy(d, timeout):
    from conftest import wait_until
    return wait_until(lambda: healthy(d), timeout=timeout)


def test_head_replies_have_no_body(start_daemon):
    """A HEAD reply (allowed or denied) carries no body, so the next
    pipelined response starts right after its head."""
    d = start_daemon(POL.replace("limit: 5", "limit: 1"))
    req = b"HEAD /check/x HTTP/1.1\r\nHost: x\r\nX-Api-Key: head\r\n\r\n"
    out = raw_http(d.port, req + req + b"GET /healthz HTTP/1.1\r\nHost: x\r\n"
                   b"Connection: close\r\n\r\n", timeout=3, expect=0)
    parts = out.split(b"\r\n\r\n")
    assert parts[0].startswith(b"HTTP/1.1 200") and b"X-RateLimit-Remaining: 0" in parts[0]
    assert parts[1].startswith(b"HTTP/1.1 429") and b"Retry-After:" in parts[1]
    assert parts[2].startswith(b"HTTP/1.1 200") and parts[3].strip() == b"ok"


def test_large_pipelined_burst(start_daemon):
    d = start_daemon(POL.replace("limit: 5", "limit: 100000").replace(
        "timeout: 50ms", "timeout: 2s"))
    req = b"GET /check/x HTTP/1.1\r\nHost: x\r\nX-Api-Key: burst\r\n\r\n"
    last = b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    out = raw_http(d.port, req * 999 + last, timeout=10, expect=1000)
    assert out.count(b"HTTP/1.1 200 OK") == 1000
    assert b"X-RateLimit-Remaining: 99001\r\n" in out
    assert healthy(d)


@pytest.mark.parametrize("fmt_", ["text", "json"])
def test_untrusted_bytes_cannot_forge_log_lines(start_daemon, fmt_):
    d = start_daemon(POL.replace("routes:\n", "log: {{level: debug, format: %s, access: true}}\n"
                                 "routes:\n" % fmt_, 1))
    evil = "k\nFORGED-LINE level=error \"x\"\r\n\x1b[31mred"
    r = requests.post(d.url("/v1/check"), json={"route": "r", "key": evil}, timeout=5)
    assert r.status_code == 200
    raw_http(d.port, b"GET /check/x HTTP/1.1\r\nHost: x\r\nX-Api-Key: a\x1b[2Jb\xff\r\n"
             b"X-Original-URI: /\x1b]0;t\x07\r\nConnection: close\r\n\r\n")
    time.sleep(0.2)
    text = d.log()
    assert "FORGED-LINE" in text, "the access log does not show the key at all"
    for line in text.splitlines():
        assert not line.startswith("FORGED-LINE"), line
        assert "\x1b" not in line, repr(line)
        if fmt_ == "json":
            import json
            json.loads(line)


def test_accept_backlog_holds_a_burst_of_connects(start_daemon):
    """While the daemon cannot accept (stopped here; in life, busy), the
    kernel completes connects into the listen backlog. With libevent's
    default it was 128, and a burst of 300 gateways' connects lost SYNs to
    1 s retransmits; now every one completes at once, and is then served."""
    d = start_daemon(POL)
    os.kill(d.proc.pid, signal.SIGSTOP)
    socks = []
    try:
        assert wait_until(lambda: all_stopped(d.proc.pid))
        for _ in range(300):
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", d.port))
            socks.append(s)
        pending, deadline = set(socks), time.monotonic() + 0.5
        while pending and time.monotonic() < deadline:
            _, done, _ = select.select([], list(pending), [], 0.05)
            pending -= {s for s in done if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0}
        assert not pending, "%d of 300 connects did not complete" % len(pending)
    finally:
        os.kill(d.proc.pid, signal.SIGCONT)
    for s in socks[:5]:
        s.setblocking(True)
        s.settimeout(5)
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert s.recv(4096).startswith(b"HTTP/1.1 200")
    for s in socks:
        s.close()
    assert healthy(d)


def rss_kb(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def test_client_that_never_reads_its_replies_holds_no_memory(start_daemon):
    """Pipelined requests from a client that never reads: the daemon stops
    reading once 64 KiB of replies wait unsent (as nginx reads the next
    request only once a reply is out), so its memory stays flat while the
    client's sends block. Before, it read and answered into an unbounded
    buffer: 2 GB after 600 MB of requests. Every reply still comes, in
    order, once the client reads."""
    d = start_daemon(POL)
    base = rss_kb(d.proc.pid)
    req = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    s = socket.create_connection(("127.0.0.1", d.port), timeout=5)
    s.setblocking(False)
    sent, chunk, end = 0, req * 2000, time.monotonic() + 5
    while time.monotonic() < end and sent < 40 * 1024 * 1024:
        try:
            sent += s.send(chunk[sent % len(chunk):])
        except BlockingIOError:
            if not select.select([], [s], [], 0.5)[1]:
                break       # the daemon no longer reads: the sends block
    grown = rss_kb(d.proc.pid) - base
    assert grown < 16 * 1024, "RSS grew %d kB while %d bytes of requests " \
                              "went unread" % (grown, sent)
    assert healthy(d)
    # Read everything: every request sent whole gets its reply.
    s.setblocking(True)
    s.settimeout(5)
    # Each reply's Date (29 bytes) is masked as D...D before comparing.
    reply = (b"HTTP/1.1 200 OK\r\nDate: " + b"D" * 29 + b"\r\nContent-Type: "
             b"text/plain\r\nContent-Length: 2\r\n\r\nok")
    date_at = reply.index(b"D" * 29)
    expected = sent // len(req) * len(reply)
    got = 0
    while got < expected:
        data = bytearray(s.recv(1 << 20))
        assert data, "connection closed after %d of %d replies" % (
            got // len(reply), expected // len(reply))
        for base in range(got - got % len(reply), got + len(data), len(reply)):
            a = max(base + date_at, got) - got
            z = min(base + date_at + 29, got + len(data)) - got
            if a < z:
                data[a:z] = b"D" * (z - a)
        assert data == (reply * (len(data) // len(reply) + 2))[
            got % len(reply):got % len(reply) + len(data)], data[:200]
        got += len(data)
    s.close()


def busy_connection(port):
    """A connection in the middle of sending a request head: not idle, once
    the daemon has read it (hence the pause), and at the cap not taken for
    room until it has stalled 5 s."""
    s = socket.create_connection(("127.0.0.1", port), timeout=2)
    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
    time.sleep(0.05)
    return s


def idle_connection(port):
    """A kept-alive connection whose request has had its reply: idle."""
    s = socket.create_connection(("127.0.0.1", port), timeout=2)
    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert s.recv(4096).endswith(b"ok")
    return s


def test_max_connections_makes_new_ones_wait(start_daemon):
    """At server.max_connections of busy connections the daemon stops
    accepting, as nginx does at worker_connections: a new connection waits
    in the backlog, unserved, until one closes; and while it is full every
    reply closes its connection, so that the waiting get a turn. A flood of
    connections, each with its buffers (10,000 held 629 MB), can no longer
    take what memory it likes."""
    d = start_daemon(POL.replace("server:\n", "server:\n  max_connections: 4\n"))
    assert requests.get(d.url("/v1/policy"), timeout=2).json()["server"]["max_connections"] == 4
    held = [busy_connection(d.port) for _ in range(4)]
    try:
        assert wait_until(lambda: "at server.max_connections" in d.log(), timeout=2), d.log()
        waiting = socket.create_connection(("127.0.0.1", d.port), timeout=2)
        waiting.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        waiting.settimeout(0.5)
        with pytest.raises(socket.timeout):
            waiting.recv(100)
        done = held.pop(0)
        done.sendall(b"\r\n")                 # its request complete
        done.settimeout(3)
        reply = done.recv(1000)
        assert reply.startswith(b"HTTP/1.1 200 OK") and b"\r\nConnection: close" in reply
        assert done.recv(100) == b""
        waiting.settimeout(3)
        assert waiting.recv(100).startswith(b"HTTP/1.1 200 OK")
        waiting.close()
    finally:
        for s in held:
            s.close()
    assert healthy(d)
    assert d.log().count("at server.max_connections") == 1, d.log()


def oldest_closed_rest_served(conns, rest, what, timeout=3):
    """At the cap, the oldest of conns was the one closed for room: its
    peer sees EOF; each other, sent `rest`, is served."""
    conns[0].settimeout(timeout)
    assert conns[0].recv(100) == b"", "the %s was not the one closed" % what
    for s in conns[1:]:
        s.sendall(rest)
        s.settimeout(timeout)
        assert s.recv(1000).startswith(b"HTTP/1.1 200 OK")


def test_idle_connections_make_room_at_the_cap(start_daemon):
    """A gateway keeps idle connections in its pool: at the cap, the one
    idle longest is closed for a new connection (as nginx does at
    worker_connections), so new checks and health probes never wait behind
    an idle pool (they waited for the gateway's read timeout, 5 s in
    conf/nginx.conf, and failed)."""
    d = start_daemon(POL.replace("server:\n", "server:\n  max_connections: 4\n"))
    pool = []
    for _ in range(4):
        s = socket.create_connection(("127.0.0.1", d.port), timeout=2)
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert s.recv(1000).startswith(b"HTTP/1.1 200 OK")
        pool.append(s)
        time.sleep(0.02)
    try:
        t0 = time.monotonic()
        r = requests.get(d.url("/healthz"), timeout=3)
        assert r.status_code == 200 and time.monotonic() - t0 < 1.0
        oldest_closed_rest_served(pool, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n",
                                  "longest idle", timeout=2)
    finally:
        for s in pool:
            s.close()


def test_silent_connections_make_room_at_the_cap(start_daemon):
    """Connections that connect and never send (a port scan, a client
    that hangs) held every slot until idle_timeout, 60 s, while health
    probes waited in the backlog. As nginx does at worker_connections, one
    that has sent nothing for a second counts as idle: at the cap, the
    oldest is closed for a new connection. One that sends its first
    request within the second is never closed for room."""
    d = start_daemon(POL.replace("server:\n", "server:\n  max_connections: 4\n  workers: 1\n"))
    prompt = [socket.create_connection(("127.0.0.1", d.port), timeout=3) for _ in range(4)]
    try:
        # At the cap with four fresh ones, each sending within the second.
        waiting = socket.create_connection(("127.0.0.1", d.port), timeout=3)
        time.sleep(0.3)
        for s in prompt:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert s.recv(1000).startswith(b"HTTP/1.1 200 OK")
        waiting.close()
    finally:
        for s in prompt:
            s.close()
    before = settled_sockets(d)
    silent = []
    for _ in range(4):
        silent.append(socket.create_connection(("127.0.0.1", d.port), timeout=3))
        time.sleep(0.05)
    try:
        assert wait_until(lambda: daemon_sockets(d) - before == 4, timeout=3)
        t0 = time.monotonic()
        r = requests.get(d.url("/healthz"), timeout=5)
        assert r.status_code == 200
        took = time.monotonic() - t0
        assert took > 0.5, "a connection younger than a second was closed " \
                           "for room (%.2f s)" % took
        oldest_closed_rest_served(silent, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n",
                                  "oldest silent one")
    finally:
        for s in silent:
            s.close()
    assert healthy(d)


def test_stalled_requests_make_room_at_the_cap(start_daemon):
    """Connections that send part of a head and stop (a slowloris) were
    not idle, so at the cap they held every slot until idle_timeout while
    new checks waited in the backlog (an audit: 9.5 s at 10 s). A request
    begun 5 s ago and still not whole makes room now, the oldest first,
    as a gateway sends its requests at once; a request still arriving
    within the 5 s is never closed for room."""
    d = start_daemon(POL.replace("server:\n", "server:\n  max_connections: 4\n"
                                 "  workers: 1\n  idle_timeout: 60s\n"))
    stalled = [busy_connection(d.port) for _ in range(4)]
    try:
        t0 = time.monotonic()
        r = requests.get(d.url("/healthz"), timeout=15)
        took = time.monotonic() - t0
        assert r.status_code == 200
        assert 4.0 < took < 9.0, "answered after %.2f s" % took
        # the others' requests made whole
        oldest_closed_rest_served(stalled, b"\r\n", "oldest stalled one")
    finally:
        for s in stalled:
            s.close()
    assert healthy(d)


def daemon_sockets(d):
    return sum(t.startswith("socket:") for t in open_files(d.proc.pid))


def settled_sockets(d):
    """The daemon's socket count once it holds still: the readiness
    probe's connection is gone by then."""
    counts = [daemon_sockets(d)]
    while (len(counts) < 3 or len(set(counts[-3:])) > 1) and len(counts) < 60:
        time.sleep(0.05)
        counts.append(daemon_sockets(d))
    return counts[-1]


def test_idle_connections_under_the_cap_stay_open_whichever_worker_holds_them(
        start_daemon):
    """The cap is the daemon's, not a share per worker: the kernel hands a
    shared listening socket's connections out unevenly, and a worker past
    its half closed idle keep-alive connections with the daemon far below
    server.max_connections (of 60 opened under a cap of 50 with 2
    workers, 25 stayed). Now all stay up to the cap, and the next one
    past it replaces the one idle longest."""
    d = start_daemon(POL.replace("server:\n", "server:\n  max_connections: 12\n"
                                 "  workers: 2\n"))
    req = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    held = []
    try:
        for _ in range(12):
            held.append(idle_connection(d.port))
            time.sleep(0.02)
        time.sleep(0.3)
        for i, s in enumerate(held):    # every one still answers
            s.sendall(req)
            assert s.recv(4096).endswith(b"ok"), i
        held.append(idle_connection(d.port))
        time.sleep(0.2)
        # the cap holds for the daemon: one of the idle twelve made room
        closed = 0
        for s in held[:12]:
            try:
                s.sendall(req)
                closed += not s.recv(4096)
            except (ConnectionResetError, BrokenPipeError):
                closed += 1
        assert closed == 1, closed
    finally:
        for s in held:
            s.close()
    assert healthy(d)


def test_a_cap_lowered_by_reload_is_reached_across_workers(start_daemon):
    """With 2 workers, a cap lowered by reload under idle connections: each
    worker closed its part of the excess from a total the other was
    changing, and the daemon stayed above the new cap for good (25 of a
    cap of 20). And connections busy at the reload kept alive after their
    replies, so the daemon held more than the cap while a pool reused
    them. Now every idle one goes, and each busy one's reply closes it
    while the daemon is over the cap."""
    conf = "server:\n  max_connections: %d\n  workers: 2\n  idle_timeout: 30s\n"
    d = start_daemon(POL.replace("server:\n", conf % 40))
    before = settled_sockets(d)
    held = []
    try:
        for _ in range(20):
            held.append(idle_connection(d.port))
        busy = [busy_connection(d.port) for _ in range(10)]
        held += busy
        d.write_policy(POL.replace("server:\n", conf % 4))
        d.signal(signal.SIGHUP)
        # the 20 idle go at once; the 10 busy stay
        assert wait_until(lambda: daemon_sockets(d) - before == 10, timeout=3), \
            daemon_sockets(d) - before
        closes = []
        for s in busy:
            s.sendall(b"\r\n")
            head = s.recv(4096)
            assert head.startswith(b"HTTP/1.1 200"), head
            closes.append(b"Connection: close" in head)
            time.sleep(0.05)
        assert closes == [True] * 6 + [False] * 4, closes
        assert wait_until(lambda: daemon_sockets(d) - before == 4, timeout=2), \
            daemon_sockets(d) - before
    finally:
        for s in held:
            s.close()
    assert healthy(d)


def test_max_connections_is_the_daemons_total_across_workers(start_daemon):
    """server.max_connections caps the workers' connections together, not
    each worker's: with 2 workers and a cap of 3, of 5 busy connections 3
    are taken."""
    d = start_daemon(POL.replace("server:\n", "server:\n  max_connections: 3\n  workers: 2\n"))
    before = settled_sockets(d)
    held = [busy_connection(d.port) for _ in range(5)]
    try:
        # Waited for, not slept for: under load (ASan, a busy machine) the
        # workers take their share later than 0.2 s.
        assert wait_until(lambda: daemon_sockets(d) - before == 3, timeout=3), \
            daemon_sockets(d) - before
        time.sleep(0.2)
        assert daemon_sockets(d) - before == 3
    finally:
        for s in held:
            s.close()
    assert healthy(d)


def test_connection_cap_leaves_descriptors_for_redis(start_daemon, redis_server, tmp_path):
    """Under a low `ulimit -n`, accepted connections could take every
    descriptor, and the Redis link, once dropped, had to win a free one
    against the accepts (an audit saw checks fail open for 4-7 s at a
    time). The cap in force is what the limit leaves after a reserve, the
    log says so at startup, and with every slot taken the link comes back."""
    from conftest import BIN
    wrapper = tmp_path / "low-nofile.sh"
    wrapper.write_text("#!/bin/sh\nulimit -n 300\nexec %s \"$@\"\n" % BIN)
    wrapper.chmod(0o755)
    d = start_daemon(POL, bin=str(wrapper))
    assert wait_until(lambda: "leaves room for 108" in d.log(), timeout=2), d.log()
    held = []
    try:
        for _ in range(400):    # more than the descriptor limit, all busy
            s = socket.create_connection(("127.0.0.1", d.port), timeout=2)
            s.sendall(b"GET /healthz HTTP/1.1\r\n")
            held.append(s)
        assert wait_until(lambda: "at server.max_connections" in d.log(), timeout=3), d.log()
        # Drop the daemon's Redis link: it must come back although every
        # connection slot is taken.
        rc = redis_server.client()
        rc.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
        assert wait_until(lambda: d.log().count(": connected") >= 2, timeout=3), d.log()
    finally:
        for s in held:
            s.close()
    assert still_counts(d, "after-cap")


def test_connections_in_a_burst_are_never_closed_at_the_cap(start_daemon):
    """Only a kept-alive connection that has had its reply counts as idle:
    a connection accepted a moment ago, whose request is still on its way,
    was closed for the next one (43 of 1,200 requests in bursts of 6 at a
    cap of 2 failed). Now the burst waits its turn and every request gets
    its reply."""
    import concurrent.futures
    d = start_daemon(POL.replace("server:\n", "server:\n  max_connections: 2\n"))

    def one(_):
        try:
            return requests.get(d.url("/healthz"), timeout=5).status_code
        except requests.RequestException as e:
            return repr(e)
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        for _ in range(20):
            results = list(pool.map(one, range(6)))
            assert results == [200] * 6, results


def test_reload_at_the_cap_keeps_idle_connections_closable(start_daemon):
    """A reload while a worker holds its share of idle keep-alive
    connections must not stop it accepting: a new connection was left in
    the backlog until an idle one timed out."""
    d = start_daemon(POL.replace("server:\n", "server:\n  max_connections: 2\n"))
    pool = [requests.Session() for _ in range(2)]
    for s in pool:
        assert s.get(d.url("/healthz"), timeout=2).status_code == 200
    d.signal(signal.SIGHUP)
    assert wait_until(lambda: "reload (SIGHUP)" in d.log(), timeout=2), d.log()
    t0 = time.monotonic()
    assert requests.get(d.url("/healthz"), timeout=5).status_code == 200
    assert time.monotonic() - t0 < 1.0
    for s in pool:
        s.close()


def test_a_cap_lowered_on_reload_closes_idle_connections(start_daemon):
    """server.max_connections lowered on reload below what is open, all of
    them idle: a new connection waited until enough reached idle_timeout
    (7.7 s here, up to 60 s by default). The idle ones beyond the new cap
    go at the reload, longest idle first; a busy one is kept."""
    d = start_daemon(POL.replace("server:\n", "server:\n  max_connections: 100\n"
                                 "  idle_timeout: 30s\n"))
    busy = busy_connection(d.port)
    pool = []
    try:
        for _ in range(10):
            s = socket.create_connection(("127.0.0.1", d.port), timeout=2)
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert s.recv(1000).startswith(b"HTTP/1.1 200 OK")
            pool.append(s)
            time.sleep(0.03)            # apart on a coarse clock of 10 ms ticks
        d.write_policy(POL.replace("server:\n", "server:\n  max_connections: 4\n"
                                   "  idle_timeout: 30s\n"))
        d.signal(signal.SIGHUP)
        assert wait_until(lambda: "loaded" in d.log(), timeout=3), d.log()
        time.sleep(0.2)                 # the worker takes the policy in its loop
        t0 = time.monotonic()
        with socket.create_connection(("127.0.0.1", d.port), timeout=3) as s:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert s.recv(1000).startswith(b"HTTP/1.1 200 OK")
        assert time.monotonic() - t0 < 1.0
        closed = []
        for s in pool:
            s.settimeout(0.05)
            try:
                closed.append(s.recv(100) == b"")
            except socket.timeout:
                closed.append(False)
        # 11 open for 4: the 7 idle longest went at the reload, and the
        # next for the new connection; the busy one and the newest stayed
        assert closed == [True] * 8 + [False] * 2, closed
        busy.sendall(b"\r\n")
        busy.settimeout(3)
        assert busy.recv(1000).startswith(b"HTTP/1.1 200 OK")
    finally:
        busy.close()
        for s in pool:
            s.close()


def closes_after_reply(port, data):
    """Sends data, reads one reply; True when the daemon then closes (EOF
    within 1 s), False when the connection stays open."""
    s = socket.create_connection(("127.0.0.1", port), timeout=2)
    try:
        s.sendall(data)
        reply = s.recv(65536)
        assert reply.startswith(b"HTTP/1."), reply
        s.settimeout(1.0)
        try:
            return s.recv(100) == b""
        except socket.timeout:
            return False
    finally:
        s.close()


def test_close_in_any_connection_line_wins(start_daemon):
    """RFC 9110 5.3: repeated Connection lines are one list; RFC 9112 9.3:
    close wins, in HTTP/1.0 too. Only the first line was read, and 1.0
    looked only for keep-alive."""
    d = start_daemon(POL)
    assert closes_after_reply(d.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n"
                              b"Connection: keep-alive\r\nConnection: close\r\n\r\n")
    assert closes_after_reply(d.port, b"GET /healthz HTTP/1.0\r\n"
                              b"Connection: keep-alive, close\r\n\r\n")
    assert not closes_after_reply(d.port, b"GET /healthz HTTP/1.0\r\n"
                                  b"Connection: foo\r\nConnection: keep-alive\r\n\r\n")
    assert not closes_after_reply(d.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")


def test_close_with_pipelined_bytes_ends_with_fin_not_reset(start_daemon):
    """A client pipelining past its own Connection: close: closing with its
    bytes unread made the kernel send a reset, which can destroy the reply
    (RFC 9112 9.6). The daemon half-closes and drains, as after an error."""
    d = start_daemon(POL)
    for _ in range(3):
        s = socket.create_connection(("127.0.0.1", d.port), timeout=3)
        try:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
                      + b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n" * 200)
            time.sleep(0.1)
            got = b""
            while True:
                chunk = s.recv(65536)      # ConnectionResetError: the bug
                if not chunk:
                    break
                got += chunk
            assert got.startswith(b"HTTP/1.1 200 OK") and got.count(b"HTTP/1.1 ") == 1, got
        finally:
            s.close()
    assert healthy(d)


def test_a_lingering_connection_makes_room_at_the_cap(start_daemon):
    """A close reply that lingers (pipelined bytes behind it) waits for its
    client's EOF: at the cap it held the slot for the 2 s linger while a
    new connection waited. It has nothing more to answer: it goes first."""
    d = start_daemon(POL.replace("server:\n", "server:\n  max_connections: 1\n"))
    s = socket.create_connection(("127.0.0.1", d.port), timeout=3)
    try:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
                  b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        got = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break                       # the daemon's FIN; our side stays open
            got += chunk
        assert got.startswith(b"HTTP/1.1 200 OK")
        assert new_connection_answered_s(d) < 1.0
    finally:
        s.close()


def test_lingering_connections_never_take_a_worker_past_its_share(start_daemon):
    """At the cap with others waiting, each connection that closes with a
    pipelined request behind it (and so lingers) makes room for exactly
    one: accepting was left on after that, and every such round took the
    worker one further past its share (4, then 5, 6, 7, 8 of 4)."""
    d = start_daemon(POL.replace("server:\n", "server:\n  max_connections: 2\n"))
    before = settled_sockets(d)
    close_and_more = (b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
                      b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    busy = busy_connection(d.port)
    clients = [socket.create_connection(("127.0.0.1", d.port), timeout=3) for _ in range(6)]
    held = []
    try:
        for s in clients:                 # one at a time, each once it is served
            s.sendall(close_and_more)
            s.settimeout(3)
            assert s.recv(1000).startswith(b"HTTP/1.1 200 OK")
            time.sleep(0.2)
            held.append(daemon_sockets(d) - before)
        assert max(held) <= 3, held       # the share, and one making room
    finally:
        busy.close()
        for s in clients:
            s.close()
    assert healthy(d)


def big_policy(routes, tag="r"):
    """A policy whose /v1/policy is about 4 kB a route: 250 routes, ~1 MB."""
    return policy("".join(
        "  - name: %s%d\n    match: {prefix: /%s%d/}\n    key: header:X-Api-Key\n"
        "    limits: [{name: q, algorithm: fixed_window, limit: 5, window: 1h}]\n"
        "    overrides:\n      - keys: [%s]\n"
        "        limits: [{name: q, algorithm: fixed_window, limit: 9, window: 1h}]\n"
        % (tag, i, tag, i, ",".join("key-%d-%d" % (i, j) for j in range(300)))
        for i in range(routes)))


def read_reply(s, buf=b""):
    """One reply (head, body) from s; what came after it stays in the
    returned rest."""
    while b"\r\n\r\n" not in buf:
        data = s.recv(1 << 16)
        assert data, "closed before a reply head"
        buf += data
    head, _, buf = buf.partition(b"\r\n\r\n")
    length = int([ln.split(b":", 1)[1] for ln in head.split(b"\r\n")
                  if ln.lower().startswith(b"content-length:")][0])
    while len(buf) < length:
        data = s.recv(1 << 20)
        assert data, "closed %d bytes into a %d-byte body" % (len(buf), length)
        buf += data
    return head, buf[:length], buf[length:]


def test_unread_policy_replies_share_one_body(start_daemon):
    """GET /v1/policy of a large policy, asked on many connections that do
    not read: the body is rendered once per load and lent to each reply,
    so memory does not grow by a copy per connection (3,000 connections
    held 2.7 GB for a 942 kB policy), and the worker's loop does not spend
    a rendering per request."""
    d = start_daemon(big_policy(250).replace("server:\n", "server:\n  workers: 1\n"))
    whole = requests.get(d.url("/v1/policy"), timeout=5)
    assert whole.status_code == 200 and len(whole.content) > 800_000
    base = rss_kb(d.proc.pid)
    socks = []
    try:
        for _ in range(200):
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.connect(("127.0.0.1", d.port))
            s.sendall(b"GET /v1/policy HTTP/1.1\r\nHost: x\r\n\r\n" * 2 +
                      b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            socks.append(s)
        assert wait_until(lambda: healthy(d), timeout=5)
        grown = rss_kb(d.proc.pid) - base
        # A copy each would be 200 x 0.9 MB; the connections' own buffers
        # take a few MB.
        assert grown < 40 * 1024, "RSS grew %d kB" % grown
        # Every reply arrives whole, in order, on a connection read late.
        for s in (socks[0], socks[-1]):
            s.settimeout(10)
            rest = b""
            for _ in range(2):
                head, body, rest = read_reply(s, rest)
                assert head.startswith(b"HTTP/1.1 200 OK") and body == whole.content
            head, body, rest = read_reply(s, rest)
            assert body == b"ok" and rest == b""
    finally:
        for s in socks:
            s.close()
    assert healthy(d)


def test_policy_reply_outlives_a_reload(start_daemon):
    """A reply of the policy still being read when a reload swaps the
    policy out is sent whole, as the policy it began as; the next request
    on the connection sees the new one."""
    d = start_daemon(big_policy(250, tag="old"))
    old = requests.get(d.url("/v1/policy"), timeout=5).content
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", d.port))
    s.settimeout(10)
    try:
        s.sendall(b"GET /v1/policy HTTP/1.1\r\nHost: x\r\n\r\n")
        first = s.recv(1000)
        assert first.startswith(b"HTTP/1.1 200 OK")
        d.write_policy(big_policy(3, tag="new"))
        d.signal(signal.SIGHUP)
        assert wait_until(lambda: "new0" in requests.get(
            d.url("/v1/policy"), timeout=5).text, timeout=10), d.log()
        head, body, rest = read_reply(s, first)
        assert body == old and rest == b""
        assert json.loads(body)["routes"][0]["name"] == "old0"
        s.sendall(b"GET /v1/policy HTTP/1.1\r\nHost: x\r\n\r\n")
        head, body, rest = read_reply(s)
        assert json.loads(body)["routes"][0]["name"] == "new0"
    finally:
        s.close()
    assert healthy(d)


def test_head_of_policy_sends_no_body(start_daemon):
    """HEAD /v1/policy says the GET body's length and sends none: the
    next reply on the connection follows the head directly."""
    d = start_daemon(big_policy(2))
    length = len(requests.get(d.url("/v1/policy"), timeout=5).content)
    s = socket.create_connection(("127.0.0.1", d.port), timeout=5)
    try:
        s.sendall(b"HEAD /v1/policy HTTP/1.1\r\nHost: x\r\n\r\n"
                  b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        buf = b""
        while buf.count(b"\r\n\r\n") < 2 or not buf.endswith(b"ok"):
            data = s.recv(1 << 16)
            assert data, buf
            buf += data
        head, _, rest = buf.partition(b"\r\n\r\n")
        assert b"\r\nContent-Length: %d\r\n" % length in head + b"\r\n"
        assert rest.startswith(b"HTTP/1.1 200 OK") and rest.endswith(b"\r\n\r\nok")
    finally:
        s.close()


FLOOD = r"""
import socket, sys, time
port, conns, secs = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
req = b"GET /check/hot HTTP/1.1\r\nHost: x\r\nX-Api-Key: hot\r\n\r\n" * 200
socks = []
for _ in range(conns):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", port))
    s.setblocking(False)
    socks.append(s)
end = time.monotonic() + secs
while time.monotonic() < end:
    sent = False
    for s in socks:
        try:
            sent = s.send(req) > 0 or sent
        except BlockingIOError:
            pass
    if not sent:
        time.sleep(0.01)
for s in socks:
    s.close()
"""


def test_a_pipelining_flood_leaves_other_checks_their_turn(start_daemon):
    """Clients pipelining a denied key without reading: each request is
    answered at once from the deny cache, and a connection's whole
    pipeline went in one loop turn. Turns of a second left Redis's replies
    unread past redis.timeout, so with Redis healthy the flood's own
    checks failed open (70-80 % of them) and so did other clients' (a
    client beside it got 204 checks answered in 5 s). Each connection now
    takes at most 16 requests a turn, and Redis's replies are read between."""
    import subprocess
    import sys
    from ops_helpers import scrape
    d = start_daemon(policy(
        "  - name: hot\n    match: {prefix: /hot}\n    key: header:X-Api-Key\n"
        "    limits: [{name: q, algorithm: token_bucket, rate: 10/s, burst: 5}]\n"
        "  - name: fresh\n    match: {prefix: /}\n    key: header:X-Api-Key\n"
        "    limits: [{name: q, algorithm: fixed_window, limit: 5, window: 1h}]\n",
        server="  workers: 1\n", timeout="50ms"))
    flood = subprocess.Popen([sys.executable, "-c", FLOOD, str(d.port), "100", "4"])
    try:
        time.sleep(1)
        s = requests.Session()
        answers = []
        for i in range(40):
            r = s.get(d.url("/check/fresh"), headers={"X-Api-Key": "k%d" % i}, timeout=10)
            answers.append((r.status_code, r.headers.get("X-RateLimit-Remaining")))
    finally:
        flood.wait(timeout=30)
    m = scrape(d)
    denied, failed = m.checks("hot", "denied"), m.checks("hot", "failed_open")
    # Before, 70-80 % failed open; under ThreadSanitizer, whose build is
    # many times slower against the 50 ms timeout, up to 1.5 % still do.
    assert denied > 1000 and failed < denied / 20, (denied, failed)
    # The client beside it: a check or two may meet a slow turn under a
    # sanitizer; before, whole runs of them failed open.
    assert [a for a in answers if a != (200, "4")] == [] or \
        (len([a for a in answers if a != (200, "4")]) <= 2 and
         all(a == (200, "-1") for a in answers if a != (200, "4"))), answers
    assert healthy(d)


def test_chunked_bodies_are_read(start_daemon):
    """RFC 9112 6.1: an HTTP/1.1 server reads a chunked body. Every one got
    411, so a client streaming its body (Go's http.Client with a Reader,
    requests with a generator) could not call /v1/check."""
    d = start_daemon(POL)
    body = json.dumps({"route": "r", "key": "chunky"}).encode()

    def gen():
        yield body[:7]
        yield body[7:]
    r = requests.post(d.url("/v1/check"), data=gen(), timeout=2)
    assert r.request.headers.get("Transfer-Encoding") == "chunked"
    assert r.status_code == 200 and r.json()["remaining"] == 4, r.text
    head = b"POST /v1/check HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
    # 100-continue; extensions, trailers, bare LFs, and a request after it
    s = socket.create_connection(("127.0.0.1", d.port), timeout=3)
    s.sendall(head + b"Expect: 100-continue\r\n\r\n")
    assert s.recv(100) == b"HTTP/1.1 100 Continue\r\n\r\n"
    s.sendall(b"5;x=\"y\"\r\n" + body[:5] + b"\r\n" + b"%x\n" % (len(body) - 5) +
              body[5:] + b"\n0\r\nX-Trailer: 1\r\n\r\n" +
              b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    out = b""
    while not out.endswith(b"\r\n\r\nok"):
        b = s.recv(65536)
        assert b, out
        out += b
    s.close()
    assert out.startswith(b"HTTP/1.1 200 OK\r\n") and b'"remaining":3' in out, out
    # split at every byte, it is the same request
    s = socket.create_connection(("127.0.0.1", d.port), timeout=3)
    one = head + b"\r\n%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n"
    for i in range(len(one)):
        s.sendall(one[i:i + 1])
        time.sleep(0.001)
    got = b""
    while b'"limits"' not in got:
        got += s.recv(65536)
    s.close()
    assert got.startswith(b"HTTP/1.1 200 OK") and b'"remaining":2' in got, got


@pytest.mark.parametrize("raw,status,says", [
    (b"Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n", 400,
     b"both Transfer-Encoding and Content-Length"),
    (b"Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", 501,
     b"Transfer-Encoding other than chunked"),
    (b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400,
     b"Transfer-Encoding given twice"),
    (b"Transfer-Encoding: chunked\r\n\r\nzz\r\n", 400, b"malformed chunk size"),
    (b"Transfer-Encoding: chunked\r\n\r\n3\r\nabcd\r\n0\r\n\r\n", 400,
     b"chunk data not followed by CRLF"),
    (b"Transfer-Encoding: chunked\r\n\r\n" + b"4000\r\n" + b"x" * 16384 + b"\r\n" +
     b"4000\r\n" + b"x" * 16384 + b"\r\n" + b"8001\r\n", 413, b"larger than 64 KiB"),
    # 64 KiB of data in one-byte chunks is more than the input a body
    # may take
    (b"Transfer-Encoding: chunked\r\n\r\n" + b"1\r\nx\r\n" * 20000 + b"0\r\n\r\n", 413,
     b"its head and chunked body over 84 KiB"),
], ids=["te+cl", "gzip", "te-twice", "bad-size", "no-crlf", "over-64k", "tiny-chunks"])
def test_chunked_framing_errors(garbage_daemon, raw, status, says):
    d = garbage_daemon[0]
    out = raw_http(d.port, b"POST /v1/check HTTP/1.1\r\nHost: x\r\n" + raw)
    assert status_of(out) == status and says in out, out[:300]
    assert b"Connection: close" in out
    out = raw_http(d.port, b"POST /v1/check HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n"
                   b"0\r\n\r\n")
    assert status_of(out) == 400 and b"HTTP/1.0" in out, out
    assert healthy(d)
