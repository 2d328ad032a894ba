"""Redis faults: kill, pause, restart, SCRIPT FLUSH, password, database,
fail-open/closed and their deadlines (SPEC §3.1, §3.3, §8)."""
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time

import pytest
import redis
import requests

from conftest import ROOT, RedisServer, wait_until
from helpers import avoid_hour_boundary  # noqa: F401  (autouse)
from helpers import ArgsRedis, all_keys, check, healthy, policy, rkey, shared_daemon, vcheck
from proxies import FakeRedis, Listener, SilentAfterHandshake, StrayReply, TrickledReplies

TIMEOUT_S = 0.050
SLACK_S = 0.250


def fw(limit, name="q"):
    return "{name: %s, algorithm: fixed_window, limit: %d, window: 1h}" % (name, limit)


def route(name, prefix, limit=5, extra=""):
    return ("  - name: %s\n    match: {prefix: %s}\n    key: ip\n%s    limits: [%s]\n"
            % (name, prefix, extra, fw(limit)))


SIMPLE = policy(route("r", "/"))


def timed_check(d, path="/check/x", headers=None):
    t0 = time.monotonic()
    r = check(d, path, "GET", headers, timeout=5)
    return r, time.monotonic() - t0


def assert_fail_open(d, n=5, path="/check/x", quota=5):
    for _ in range(n):
        r, dt = timed_check(d, path)
        assert r.status_code == 200, r.text
        assert r.headers.get("X-RateLimit-Remaining") == "-1"
        assert r.headers.get("X-RateLimit-Limit") == str(quota)
        assert "Retry-After" not in r.headers
        assert dt < TIMEOUT_S + SLACK_S, "fail-open reply took %.3fs" % dt


def limited_again(d, path="/check/x"):
    """Redis answers again: a real verdict (checks that timed out while Redis
    was paused still run once it resumes, so this may be a denial)."""
    r = check(d, path, timeout=5)
    return r.status_code in (200, 429) and int(r.headers["X-RateLimit-Remaining"]) >= 0


# ---------------------------------------------------------------- operations

def test_healthz_readyz(start_daemon, redis_server, tmp_path):
    d = start_daemon(SIMPLE)
    r = requests.get(d.url("/healthz"), timeout=2)
    assert r.status_code == 200 and r.text == "ok"
    r = requests.get(d.url("/readyz"), timeout=2)
    assert r.status_code == 200
    assert r.json() == {"ready": True, "policy": True, "redis": "up"}
    redis_server.kill()
    assert wait_until(lambda: requests.get(d.url("/readyz"), timeout=2).status_code == 503,
                      timeout=2)
    v = requests.get(d.url("/readyz"), timeout=2).json()
    assert v["ready"] is False and v["policy"] is True
    assert v["redis"] in ("down", "connecting")
    assert healthy(d)
    back = RedisServer(tmp_path, port=redis_server.port).start()
    try:
        assert wait_until(lambda: requests.get(d.url("/readyz"), timeout=2).status_code == 200,
                          timeout=3), d.log()
        assert requests.get(d.url("/readyz"), timeout=2).json()["redis"] == "up"
    finally:
        back.stop()


def test_connecting_leaves_no_error_in_redis(start_daemon, redis_server):
    """The daemon's links and checks leave Redis's error counters at zero:
    operators alert on errorstats and failed_calls, and each link's probe
    used to add one there."""
    r = redis_server.client()
    r.config_resetstat()
    d = start_daemon(policy(route("r", "/"), server="  workers: 2\n"))
    for _ in range(3):
        assert check(d, "/check/x").status_code == 200
    assert r.info("errorstats") == {}, r.info("errorstats")
    assert r.info("commandstats")["cmdstat_evalsha"]["failed_calls"] == 0


@pytest.fixture(scope="module")
def ops_shared(tmp_path_factory):
    yield from shared_daemon(tmp_path_factory, SIMPLE)


@pytest.mark.parametrize("path", ["/", "/nope", "/checkx", "/check-x", "/v1", "/v1/nope",
                                  "/v1/checks", "/healthzz", "/metricsx", "/readyz/x"])
def test_unknown_paths_404(ops_shared, path):
    d = ops_shared[0]
    assert requests.get(d.url(path), timeout=2).status_code == 404


@pytest.mark.parametrize("method,path,allow", [
    ("POST", "/healthz", "GET, HEAD"), ("DELETE", "/readyz", "GET, HEAD"),
    ("POST", "/metrics", "GET, HEAD"), ("PUT", "/v1/policy", "GET, HEAD"),
    ("GET", "/v1/check", "POST"), ("HEAD", "/v1/check", "POST")])
def test_another_method_on_an_endpoint_is_404_with_allow(ops_shared, method, path, allow):
    """SPEC 3.3: anything but the endpoints' own methods is a 404; Allow
    and the error say which method would do."""
    d = ops_shared[0]
    r = requests.request(method, d.url(path), timeout=2)
    assert r.status_code == 404 and r.headers["Allow"] == allow, (r.status_code, r.headers)
    if method != "HEAD":
        assert r.json()["error"].startswith("not found: "), r.text
    for ok_method in allow.split(", "):
        if path != "/v1/check":
            assert requests.request(ok_method, d.url(path), timeout=2).status_code in (200, 503)


def test_policy_endpoint(start_daemon):
    d = start_daemon(SIMPLE)
    r = requests.get(d.url("/v1/policy"), timeout=2)
    assert r.status_code == 200
    v = r.json()
    assert [rt["name"] for rt in v["routes"]] == ["r"]


# ---------------------------------------------------------------- fail open / closed

def test_redis_killed_fails_open_fast(start_daemon, redis_server):
    d = start_daemon(SIMPLE)
    assert check(d, "/check/x").headers["X-RateLimit-Remaining"] == "4"
    redis_server.kill()
    assert_fail_open(d, n=10)
    r = vcheck(d, {"route": "r", "key": "1.2.3.4"})
    assert r.status_code == 200
    v = r.json()
    assert v["allowed"] is True and v["degraded"] is True
    assert r.headers["X-RateLimit-Remaining"] == "-1"
    assert healthy(d)


def test_redis_killed_fails_closed(start_daemon, redis_server):
    d = start_daemon(SIMPLE.replace("routes:\n", "failure_mode: closed\nroutes:\n"))
    assert check(d, "/check/x").status_code == 200
    redis_server.kill()
    for _ in range(5):
        r, dt = timed_check(d)
        assert r.status_code == 503
        assert r.headers.get("X-RateLimit-Remaining") == "-1"
        assert r.headers.get("X-RateLimit-Limit") == "5"
        assert dt < TIMEOUT_S + SLACK_S
    r = vcheck(d, {"route": "r", "key": "k"})
    assert r.status_code == 503
    assert r.json()["degraded"] is True and r.json()["allowed"] is False


def test_a_degraded_reply_sends_the_ietf_policy_but_no_state(start_daemon, redis_server):
    """With server.ietf_headers, a fail-open or fail-closed reply still
    carries RateLimit-Policy (the limits are the policy's, known without
    Redis), but not RateLimit or X-RateLimit-Reset, whose state Redis did
    not give: a client that reads the policy field keeps its quota."""
    two = route("r", "/").replace(
        "limits: [%s]" % fw(5),
        "limits: [%s, {name: b, algorithm: token_bucket, rate: \"1/s\", burst: 3}]" % fw(5))
    assert "token_bucket" in two
    d = start_daemon(policy(route("c", "/c/", extra="    failure_mode: closed\n") + two,
                            server="  ietf_headers: true\n"))
    want = '"q";q=5;w=3600, "b";q=3;w=3'
    r = check(d, "/check/x")
    assert r.status_code == 200 and r.headers["RateLimit-Policy"] == want
    assert "RateLimit" in r.headers
    redis_server.kill()
    for path, status in (("/check/x", 200), ("/check/c/x", 503)):
        r = check(d, path)
        assert r.status_code == status, path
        assert r.headers["X-RateLimit-Remaining"] == "-1"
        assert "RateLimit" not in r.headers and "X-RateLimit-Reset" not in r.headers
    assert check(d, "/check/x").headers["RateLimit-Policy"] == want
    assert check(d, "/check/c/x").headers["RateLimit-Policy"] == '"q";q=5;w=3600'
    r = vcheck(d, {"route": "r", "key": "k"})
    assert r.json()["degraded"] is True and r.headers["RateLimit-Policy"] == want


def test_failure_mode_route_override(start_daemon, redis_server):
    d = start_daemon(policy(
        route("inh", "/inh/") + route("opn", "/opn/", extra="    failure_mode: open\n"),
        top="failure_mode: closed\n"))
    d2 = start_daemon(policy(
        route("inh", "/inh/") + route("cls", "/cls/", extra="    failure_mode: closed\n")))
    redis_server.kill()
    assert check(d, "/check/inh/x").status_code == 503
    r = check(d, "/check/opn/x")
    assert r.status_code == 200 and r.headers["X-RateLimit-Remaining"] == "-1"
    r = check(d2, "/check/inh/x")
    assert r.status_code == 200 and r.headers["X-RateLimit-Remaining"] == "-1"
    r = check(d2, "/check/cls/x")
    assert r.status_code == 503 and r.headers["X-RateLimit-Remaining"] == "-1"


def test_redis_paused_replies_within_deadline(start_daemon, redis_server):
    d = start_daemon(SIMPLE)
    assert check(d, "/check/x").headers["X-RateLimit-Remaining"] == "4"
    redis_server.pause()
    try:
        assert_fail_open(d, n=8)
        t0 = time.monotonic()
        assert healthy(d)
        assert time.monotonic() - t0 < 0.5
        r = vcheck(d, {"route": "r", "key": "k"})
        assert r.status_code == 200 and r.json()["degraded"] is True
    finally:
        redis_server.resume()
    assert wait_until(lambda: limited_again(d), timeout=3), d.log()
    # limiting works again: a denial comes within the quota
    statuses = [check(d, "/check/x").status_code for _ in range(6)]
    assert 429 in statuses


def test_deadline_holds_under_client_load(start_daemon, redis_server, tmp_path):
    """The deadline timers must not wait for a quiet moment: wrk keeps
    every connection readable (16 pipelined checks of a path no route
    matches, which never ask Redis) while Redis is paused, and checks that
    do ask Redis must still fail open by redis.timeout. With the timers
    below client I/O in priority, libevent never ran them under this load:
    the first probe waited 1.05 s, for the stall watchdog."""
    if shutil.which("wrk") is None:
        pytest.skip("wrk is not installed")
    d = start_daemon(policy(route("r", "/limited/")))
    assert check(d, "/check/limited/x").headers["X-RateLimit-Remaining"] == "4"
    script = tmp_path / "pipe.lua"
    script.write_text(
        'init = function(args)\n'
        '  local r = {}\n'
        '  for i = 1, 16 do r[i] = wrk.format("GET", "/check/nothing") end\n'
        '  req = table.concat(r)\n'
        'end\n'
        'request = function() return req end\n')
    load = subprocess.Popen(["wrk", "-t1", "-c32", "-d4s", "-s", str(script),
                             d.url("/check/nothing")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        redis_server.pause()
        try:
            took = []
            for _ in range(10):
                r, dt = timed_check(d, "/check/limited/x")
                assert r.status_code == 200 and r.headers["X-RateLimit-Remaining"] == "-1"
                took.append(dt)
            assert max(took) < TIMEOUT_S + SLACK_S, ["%.3f" % t for t in took]
        finally:
            redis_server.resume()
    finally:
        load.wait(10)
    assert healthy(d)


def pipelined_reply_times(d, n):
    """Sends n checks in one write on one connection; returns the bytes of
    their n replies and, per reply, the seconds from the send until it had
    come."""
    one = b"GET /check/x HTTP/1.1\r\nHost: x\r\n\r\n"
    with socket.create_connection(("127.0.0.1", d.port), timeout=5) as s:
        t0 = time.monotonic()
        s.sendall(one * n)
        buf, times = b"", []
        while len(times) < n:
            data = s.recv(65536)
            assert data, "connection closed after %d replies" % len(times)
            buf += data
            while len(times) < buf.count(b"HTTP/1.1 "):
                times.append(time.monotonic() - t0)
    return buf, times


def test_pipelined_checks_each_within_the_deadline(start_daemon, redis_server):
    """Checks pipelined on one connection are answered in order, each by
    redis.timeout after it arrived: one waiting in the buffer behind others
    counts from when its bytes came, not from when its turn came (else the
    fifth of five would answer after 5 x timeout)."""
    d = start_daemon(policy(route("r", "/"), timeout="200ms"))
    assert check(d, "/check/x").headers["X-RateLimit-Remaining"] == "4"
    redis_server.pause()
    try:
        buf, times = pipelined_reply_times(d, 5)
        assert buf.count(b"HTTP/1.1 200 ") == 5, buf
        assert buf.count(b"X-RateLimit-Remaining: -1\r\n") == 5, buf
        assert max(times) < 0.2 + SLACK_S, ["%.3f" % t for t in times]
    finally:
        redis_server.resume()
    assert wait_until(lambda: limited_again(d), timeout=3), d.log()


def test_silent_redis_costs_one_timeout_not_one_per_check(start_daemon, redis_server):
    """Redis runs calls in order: once it has left one unanswered for
    redis.timeout, a new check would only wait behind it. The first check
    after Redis goes silent waits its timeout; the next ones, before the
    watchdog drops the link (1 s), are answered at once by the failure
    mode and counted as timeouts."""
    d = start_daemon(SIMPLE)
    assert check(d, "/check/x").headers["X-RateLimit-Remaining"] == "4"
    redis_server.pause()
    try:
        first, dt = timed_check(d)
        assert first.headers["X-RateLimit-Remaining"] == "-1"
        assert dt >= TIMEOUT_S * 0.9, dt
        took = []
        for _ in range(8):
            r, dt = timed_check(d)
            assert r.status_code == 200 and r.headers["X-RateLimit-Remaining"] == "-1"
            took.append(dt)
        assert sum(t < TIMEOUT_S / 2 for t in took) >= 7, ["%.3f" % t for t in took]
        metrics = requests.get(d.url("/metrics"), timeout=5).text
        assert 'ratelimitd_redis_errors_total{kind="timeout"} 9' in metrics, metrics
    finally:
        redis_server.resume()
    assert wait_until(lambda: limited_again(d), timeout=3), d.log()


def test_redis_taking_no_script_calls_is_one_outage(start_daemon, redis_server):
    """CLIENT PAUSE WRITE (a failover's pause) lets the handshake through
    (INFO, SCRIPT LOAD) but holds every script call. Each link then comes
    up and is dropped by the watchdog a second later; that must read as one
    outage: one line when it starts and one when Redis answers again, not a
    "connected" and a "dropping" line per second with the backoff reset
    each time."""
    d = start_daemon(SIMPLE)
    assert check(d, "/check/x").status_code == 200
    redis_server.client().execute_command("CLIENT", "PAUSE", "3500", "WRITE")
    # Stop short of the pause's end: once it lifts, the calls the live link
    # still held run, and a check after them may rightly be denied.
    end = time.monotonic() + 3.2
    while time.monotonic() < end:
        assert check(d, "/check/x").status_code == 200
        time.sleep(0.02)
    assert wait_until(lambda: limited_again(d) and "answering again" in d.log(),
                      timeout=5), d.log()
    log = d.log()
    assert log.count("dropping the link") == 1, log
    assert log.count("answering again") == 1, log
    assert log.count(": connected") == 1, log     # the first link only


def readyz(d):
    r = requests.get(d.url("/readyz"), timeout=2)
    return r.status_code, r.json()["redis"]


def test_readyz_is_not_ready_while_redis_takes_no_script_calls(start_daemon, redis_server):
    """Under CLIENT PAUSE WRITE every link the daemon makes takes the
    handshake and then answers no check. /readyz and the gauge said "up"
    for most of such an outage (each new link counted as up) while every
    check failed open; a link is up only once it has answered a script
    call. When the pause ends, readiness comes back without any check
    (a probe call), or a Kubernetes pod taken out of its Service for not
    being ready would never get the traffic to prove itself again."""
    d = start_daemon(SIMPLE)
    assert check(d, "/check/x").status_code == 200
    rc = redis_server.client()
    rc.execute_command("CLIENT", "PAUSE", "4000", "WRITE")
    paused_until = time.monotonic() + 4.0
    samples = []
    while time.monotonic() < paused_until - 0.3:
        r = check(d, "/check/x")
        assert r.headers["X-RateLimit-Remaining"] == "-1", d.log()
        if "dropping the link" in d.log():
            samples.append(readyz(d))
            assert "ratelimitd_redis_connected 0" in requests.get(
                d.url("/metrics"), timeout=2).text
        time.sleep(0.02)
    assert len(samples) > 20, d.log()
    assert all(s == (503, "connecting") or s == (503, "down") for s in samples), samples
    assert (503, "connecting") in samples, samples      # the reconnected, silent link
    assert wait_until(lambda: readyz(d) == (200, "up"), timeout=paused_until - time.monotonic() + 2), \
        d.log()
    assert limited_again(d)


def test_a_daemon_started_during_client_pause_is_ready_when_it_ends(start_daemon, redis_server):
    """The first link too: SCRIPT LOAD answers under CLIENT PAUSE WRITE,
    a check would not."""
    redis_server.client().execute_command("CLIENT", "PAUSE", "2500", "WRITE")
    t0 = time.monotonic()
    d = start_daemon(SIMPLE, wait_ready=False)
    assert wait_until(lambda: readyz(d)[1] != "down", timeout=2)
    if time.monotonic() - t0 < 2.2:
        assert readyz(d) == (503, "connecting"), d.log()
    assert wait_until(lambda: readyz(d) == (200, "up"), timeout=5), d.log()
    assert time.monotonic() - t0 > 2.4
    assert check(d, "/check/x").headers["X-RateLimit-Remaining"] == "4"


TWO_LIMITS = policy(
    "  - name: w\n    match: {prefix: /}\n    key: header:K\n    limits:\n"
    "      - {name: q, algorithm: fixed_window, limit: 100, window: 1h}\n"
    "      - {name: b, algorithm: token_bucket, rate: 10/s, burst: 100}\n")


def read_reply(sock):
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, "connection closed"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))
    while len(body) < length:
        body += sock.recv(65536)
    remaining = re.search(rb"(?i)x-ratelimit-remaining: *(-?\d+)", head)
    return int(head.split(b" ", 2)[1]), remaining and int(remaining.group(1))


def test_a_key_of_the_wrong_type_fails_only_its_own_check(start_daemon, redis_server):
    """A key of another type at one client's key name (WRONGTYPE) ended the
    whole script call: the checks batched before that client's were charged
    and answered as failures, those after it never decided. Only that
    client's check may fail, and it must not be charged on its other
    limit either (all-or-nothing)."""
    d = start_daemon(TWO_LIMITS)
    rc = redis_server.client()
    rc.set(rkey("w", "bad", "b", "token_bucket"), "not a bucket")
    keys = ["k%d" % i for i in range(30)]
    keys[7] = "bad"
    calls0 = rc.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)
    socks = [socket.create_connection(("127.0.0.1", d.port), timeout=5) for _ in keys]
    try:
        for _ in range(3):
            for s, k in zip(socks, keys):
                s.sendall(("GET /check HTTP/1.1\r\nHost: x\r\nX-Original-URI: /a\r\n"
                           "K: %s\r\n\r\n" % k).encode())
            for s, k in zip(socks, keys):
                status, remaining = read_reply(s)
                assert status == 200, (k, status)
                if k == "bad":
                    assert remaining == -1
                else:
                    assert remaining is not None and remaining >= 0, (k, remaining, d.log())
    finally:
        for s in socks:
            s.close()
    calls = rc.info("commandstats")["cmdstat_evalsha"]["calls"] - calls0
    assert calls < 90          # some checks shared a call (batching is the point)
    for k in keys:
        count = rc.hget(rkey("w", k, "q", "fixed_window"), "n")
        assert count == (None if k == "bad" else b"3"), (k, count)
    assert 'ratelimitd_redis_errors_total{kind="error"} 3' in requests.get(
        d.url("/metrics"), timeout=2).text
    assert wait_until(lambda: "WRONGTYPE" in d.log(), timeout=3), d.log()


def test_a_link_silent_after_its_handshake_is_dropped_without_checks(start_daemon,
                                                                       redis_server):
    """The first script call of a link (the probe that makes it ready) has
    the stall watchdog's deadline like a check: a link that answered its
    handshake and then went silent, socket open, kept /readyz at 503 for
    as long as no check came to trip the watchdog."""
    proxy = SilentAfterHandshake(redis_server.port)
    try:
        d = start_daemon(SIMPLE, wait_ready=False, redis_port=proxy.port)
        assert wait_until(lambda: readyz(d) == (200, "up"), timeout=5), d.log()
        assert "no reply to the first script call" in d.log(), d.log()
        assert check(d, "/check/x").headers["X-RateLimit-Remaining"] == "4"
    finally:
        proxy.close()


class Silent(Listener):
    """Takes each connection and never answers it."""

    def take(self, sock):
        self.socks.append(sock)


def test_a_handshake_never_answered_says_which_half_failed(start_daemon):
    """"no answer within connect_timeout" said neither the value nor
    whether the connection was made (an audit): the network or the
    server is where to look."""
    silent = Silent()
    try:
        d = start_daemon(policy(route("r", "/"), redis="  connect_timeout: 200ms\n"),
                         wait_ready=False, redis_port=silent.port)
        said = "no answer within connect_timeout (200 ms): the connection was made, " \
            "and nothing of the handshake was answered"
        assert wait_until(lambda: said in d.log(), timeout=5), d.log()
        assert d.log().count("no answer within connect_timeout") == 1, d.log()
        assert check(d, "/check/x").headers["X-RateLimit-Remaining"] == "-1"
    finally:
        silent.close()


def test_a_reply_out_of_step_drops_the_link_before_any_verdict_is_misdelivered(
        start_daemon, redis_server):
    """A middlebox put one reply no command asked for ahead of the replies:
    the oldest call took it ("unexpected script reply") and each later call
    the reply of the call before it, another client's verdict, until the
    pipeline drained (an audit: Remaining 999 on a route of 7). The first
    reply of a wrong shape now drops the link, and no reply behind it is
    delivered."""
    proxy = StrayReply(redis_server.port)
    big = "  - name: big\n    match: {prefix: /big/}\n    key: header:X-Key\n" \
          "    limits: [{algorithm: fixed_window, limit: 1000, window: 1h}]\n"
    small = "  - name: small\n    match: {prefix: /small/}\n    key: header:X-Key\n" \
            "    limits: [{algorithm: fixed_window, limit: 7, window: 1h}]\n"
    try:
        d = start_daemon(policy(big + small, timeout="2s"), redis_port=proxy.port)
        got = {}

        def ask(name, path):
            got[name] = requests.get(d.url(path), headers={"X-Key": name}, timeout=10)
        assert requests.get(d.url("/check/big/x"), headers={"X-Key": "w"},
                            timeout=5).headers["X-RateLimit-Remaining"] == "999"
        proxy.hold()
        first = threading.Thread(target=ask, args=("a", "/check/big/x"))
        first.start()
        time.sleep(0.2)     # a call of its own, on its way before the next
        second = threading.Thread(target=ask, args=("b", "/check/small/x"))
        second.start()
        time.sleep(0.2)
        proxy.release()
        first.join()
        second.join()
        for name, limit in (("a", "1000"), ("b", "7")):
            h = got[name].headers
            assert got[name].status_code == 200, (name, got[name].status_code)
            assert (h["X-RateLimit-Limit"], h["X-RateLimit-Remaining"]) == (limit, "-1"), \
                (name, dict(h), d.log())
        assert wait_until(lambda: "out of step with the calls" in d.log(), timeout=3), d.log()
        # a new link, whose replies are each its own call's again
        assert wait_until(lambda: requests.get(
            d.url("/check/small/x"), headers={"X-Key": "c"},
            timeout=5).headers["X-RateLimit-Remaining"] != "-1", timeout=5), d.log()
        r = requests.get(d.url("/check/small/x"), headers={"X-Key": "c"}, timeout=5)
        assert r.headers["X-RateLimit-Limit"] == "7" and \
            int(r.headers["X-RateLimit-Remaining"]) <= 5, dict(r.headers)
    finally:
        proxy.close()


class ClosesAtOnce(Listener):
    """A port that takes each connection and closes it: when each came."""

    def __init__(self):
        self.times = []
        super().__init__()

    def take(self, sock):
        self.times.append(time.monotonic())
        sock.close()


def test_reconnects_are_spread_not_in_step(start_daemon):
    """Every wait of the backoff was exactly 50, 100 ... 1000 ms, so a
    fleet that lost its Redis together retried each second within 2 ms
    (an audit). Each wait is now cut by up to a quarter at random: some
    gaps between attempts come out shorter than any step of the backoff
    (a timer never fires early, so without jitter none could)."""
    port = ClosesAtOnce()
    try:
        start_daemon(SIMPLE, redis_port=port.port, wait_ready=False)
        time.sleep(4.5)
        times = list(port.times)
    finally:
        port.close()
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert len(gaps) >= 4, gaps
    steps = [0.05 * 2 ** i for i in range(5)] + [1.0]

    def on_a_step(g):
        return any(s - 0.003 <= g <= s + 0.05 for s in steps)
    off = [round(g, 3) for g in gaps if not on_a_step(g)]
    assert len(off) >= 2, [round(g, 3) for g in gaps]
    assert max(gaps) <= 1.1, gaps


def test_reload_to_another_redis_leaves_nothing_pending(start_daemon, redis_server, tmp_path):
    """A reload that names another Redis while a call to the old one is
    unanswered: the new link must not inherit that call as pending (it
    was failed when the old link went), or new checks would be answered
    as if Redis were silent and the watchdog would drop the healthy link."""
    other = RedisServer(tmp_path, port=None).start()
    d = start_daemon(SIMPLE)
    try:
        assert check(d, "/check/x").headers["X-RateLimit-Remaining"] == "4"
        redis_server.pause()
        for _ in range(3):
            assert timed_check(d)[0].headers["X-RateLimit-Remaining"] == "-1"
        d.redis_port = other.port
        d.write_policy(SIMPLE)
        d.signal(signal.SIGHUP)
        assert wait_until(lambda: check(d, "/check/x").headers["X-RateLimit-Remaining"] != "-1",
                          timeout=3), d.log()
        end = time.monotonic() + 1.8
        while time.monotonic() < end:
            r = check(d, "/check/x")
            assert r.headers["X-RateLimit-Remaining"] != "-1", d.log()
            time.sleep(0.05)
        assert "dropping the link" not in d.log(), d.log()
    finally:
        redis_server.resume()
        other.stop()


def test_many_pipelined_checks_fail_open_together_when_redis_is_silent(
        start_daemon, redis_server):
    """Twenty checks pipelined while Redis is paused: each is answered by
    redis.timeout after it arrived. The least Redis time a check gets when
    its turn comes late (for a check behind a shaped reply) must not apply
    while Redis answers nothing, or each check adds it to the next (the
    twentieth came 240 ms late with a 10 ms floor)."""
    d = start_daemon(SIMPLE)
    assert check(d, "/check/x").headers["X-RateLimit-Remaining"] == "4"
    redis_server.pause()
    try:
        buf, times = pipelined_reply_times(d, 20)
        assert buf.count(b"X-RateLimit-Remaining: -1\r\n") == 20, buf
        assert max(times) < TIMEOUT_S + 0.150, ["%.3f" % t for t in times]
    finally:
        redis_server.resume()
    assert wait_until(lambda: limited_again(d), timeout=3), d.log()


def test_pipelined_behind_a_shaped_reply_gets_a_real_verdict(start_daemon, redis_server):
    """A check pipelined behind a shaped (held) reply finds its deadline,
    counted from when its bytes came, gone when its turn comes. It still
    gets 10 ms of Redis: with Redis busy 2 ms at a time (slow, but within
    redis.timeout), every check gets a real verdict, none fails open."""
    d = start_daemon(policy(
        "  - name: lb\n    match: {prefix: /}\n    key: ip\n    limits: [{algorithm: "
        'leaky_bucket, rate: "20/s", burst: 20, delay: true}]\n'))
    busy = redis_server.client().register_script(
        "local t = redis.call('TIME') local t0 = t[1] * 1e6 + t[2] "
        "repeat t = redis.call('TIME') until t[1] * 1e6 + t[2] - t0 >= 2000 return 1")
    stop = threading.Event()

    def keep_redis_busy():
        while not stop.is_set():
            busy()
    t = threading.Thread(target=keep_redis_busy)
    t.start()
    try:
        one = b"GET /check/x HTTP/1.1\r\nHost: x\r\n\r\n"
        with socket.create_connection(("127.0.0.1", d.port), timeout=10) as s:
            s.sendall(one * 16)
            buf = b""
            while buf.count(b"HTTP/1.1 ") < 16 or not buf.endswith(b"\r\n\r\n"):
                data = s.recv(65536)
                assert data, buf
                buf += data
    finally:
        stop.set()
        t.join()
    assert buf.count(b"HTTP/1.1 200 ") == 16, buf
    assert buf.count(b"X-RateLimit-Remaining: -1") == 0, buf


def test_paused_redis_under_concurrency_and_client_aborts(start_daemon, redis_server):
    d = start_daemon(SIMPLE)
    redis_server.pause()
    times = []
    errors = []

    def one():
        try:
            r, dt = timed_check(d)
            if r.status_code != 200 or r.headers.get("X-RateLimit-Remaining") != "-1":
                errors.append((r.status_code, dict(r.headers)))
            times.append(dt)
        except Exception as e:   # noqa: BLE001
            errors.append(repr(e))
    try:
        threads = [threading.Thread(target=one) for _ in range(30)]
        for t in threads:
            t.start()
        # clients that go away while their check waits on Redis
        for _ in range(20):
            s = socket.create_connection(("127.0.0.1", d.port))
            s.sendall(b"GET /check/x HTTP/1.1\r\nHost: x\r\n\r\n")
            s.close()
        for t in threads:
            t.join(10)
    finally:
        redis_server.resume()
    assert not errors, errors[:3]
    assert len(times) == 30
    # generous: 30 concurrent Python clients on 2 cores
    assert max(times) < TIMEOUT_S + 4 * SLACK_S, max(times)
    assert wait_until(lambda: limited_again(d), timeout=3)
    assert healthy(d)


def test_redis_killed_while_paused(start_daemon, redis_server):
    d = start_daemon(SIMPLE)
    redis_server.pause()
    r, dt = timed_check(d)
    assert r.status_code == 200 and dt < TIMEOUT_S + SLACK_S
    redis_server.kill()
    assert_fail_open(d, n=3)
    assert healthy(d)


def test_redis_restarted_same_port(start_daemon, redis_server, tmp_path):
    d = start_daemon(SIMPLE)
    assert check(d, "/check/x").headers["X-RateLimit-Remaining"] == "4"
    redis_server.kill()
    assert_fail_open(d, n=3)
    back = RedisServer(tmp_path, port=redis_server.port).start()
    try:
        assert wait_until(lambda: limited_again(d), timeout=3), d.log()
        statuses = [check(d, "/check/x").status_code for _ in range(6)]
        assert 429 in statuses
        assert rkey("r", "127.0.0.1", "q", "fixed_window") in all_keys(back.client())
    finally:
        back.stop()


def test_redis_down_at_start(start_daemon, redis_server, tmp_path):
    redis_server.kill()
    d = start_daemon(SIMPLE, wait_ready=False)
    assert requests.get(d.url("/readyz"), timeout=2).status_code == 503
    assert_fail_open(d, n=3)
    back = RedisServer(tmp_path, port=redis_server.port).start()
    try:
        assert wait_until(lambda: requests.get(d.url("/readyz"), timeout=2).status_code == 200,
                          timeout=3), d.log()
        assert wait_until(lambda: limited_again(d), timeout=3)
    finally:
        back.stop()


def test_script_flush_counts_continue(start_daemon, redis_server):
    d = start_daemon(SIMPLE)
    rc = redis_server.client()
    assert check(d, "/check/x").headers["X-RateLimit-Remaining"] == "4"
    assert check(d, "/check/x").headers["X-RateLimit-Remaining"] == "3"
    rc.script_flush()
    r = check(d, "/check/x")
    assert r.status_code == 200 and r.headers["X-RateLimit-Remaining"] == "2"
    rc.script_flush()
    assert check(d, "/check/x").headers["X-RateLimit-Remaining"] == "1"
    assert check(d, "/check/x").headers["X-RateLimit-Remaining"] == "0"
    rc.script_flush()
    r = check(d, "/check/x")
    assert r.status_code == 429 and r.headers["X-RateLimit-Remaining"] == "0"


# ---------------------------------------------------------------- auth and db

PASSWORD = "s3cr3t-Pa55-xyzzy-7781"


def test_password_env(start_daemon, tmp_path):
    rs = ArgsRedis(tmp_path, extra=["--requirepass", PASSWORD], password=PASSWORD).start()
    try:
        d = start_daemon(policy(route("r", "/"), redis="  password_env: RL_TEST_PW\n",
                                top="log: {level: debug, format: text, access: true}\n"),
                         redis_port=rs.port, env={"RL_TEST_PW": PASSWORD})
        assert check(d, "/check/x").headers["X-RateLimit-Remaining"] == "4"
        assert check(d, "/check/x").headers["X-RateLimit-Remaining"] == "3"
        assert rkey("r", "127.0.0.1", "q", "fixed_window") in all_keys(rs.client())
        pol = requests.get(d.url("/v1/policy"), timeout=2)
        assert pol.status_code == 200
        assert PASSWORD not in pol.text
        for path in ("/metrics", "/readyz"):
            assert PASSWORD not in requests.get(d.url(path), timeout=2).text
        time.sleep(0.2)
        assert PASSWORD not in d.log()
    finally:
        rs.stop()


def test_password_default_env_name(start_daemon, tmp_path):
    rs = ArgsRedis(tmp_path, extra=["--requirepass", PASSWORD], password=PASSWORD).start()
    try:
        d = start_daemon(SIMPLE, redis_port=rs.port, env={"REDIS_PASSWORD": PASSWORD})
        assert check(d, "/check/x").headers["X-RateLimit-Remaining"] == "4"
    finally:
        rs.stop()


def test_wrong_password_fails_open_and_is_not_logged(start_daemon, tmp_path):
    rs = ArgsRedis(tmp_path, extra=["--requirepass", PASSWORD], password=PASSWORD).start()
    wrong = "WrongPassword-99128"
    try:
        d = start_daemon(policy(route("r", "/"), redis="  password_env: RL_TEST_PW\n",
                                top="log: {level: debug, format: text, access: true}\n"),
                         redis_port=rs.port, env={"RL_TEST_PW": wrong}, wait_ready=False)
        time.sleep(0.3)
        assert requests.get(d.url("/readyz"), timeout=2).status_code == 503
        assert_fail_open(d, n=3)
        assert all_keys(rs.client()) == set()
        # several attempts (backoff 50 ms, 100 ms, ... 1 s), one line
        time.sleep(1.6)
        assert wrong not in d.log()
        assert d.log().count("AUTH failed") == 1, d.log()
        # the password becomes right: limiting resumes, and that is logged
        rs.client().config_set("requirepass", wrong)
        assert wait_until(lambda: requests.get(d.url("/readyz"), timeout=2).status_code == 200,
                          timeout=3), d.log()
        assert check(d, "/check/x").headers["X-RateLimit-Remaining"] == "4"
        assert "connected" in d.log().split("AUTH failed", 1)[1]
        assert wrong not in d.log()
    finally:
        rs.stop()


@pytest.mark.parametrize("password", [PASSWORD, "Long" + "x7" * 100])
def test_a_redis_that_echoes_the_password_does_not_put_it_in_the_log(start_daemon, tmp_path,
                                                                      password):
    """A Redis whose AUTH is renamed away (a hardening step) answers "unknown
    command 'AUTH', with args beginning with: '<password>'", cut short at
    128 bytes for a long one: that went to the log whole (an audit)."""
    rs = ArgsRedis(tmp_path, extra=["--rename-command", "AUTH", ""]).start()
    try:
        d = start_daemon(policy(route("r", "/"), redis="  password_env: RL_TEST_PW\n"),
                         redis_port=rs.port, env={"RL_TEST_PW": password}, wait_ready=False)
        assert wait_until(lambda: "AUTH failed" in d.log(), timeout=5), d.log()
        assert_fail_open(d, n=2)
        log = d.log()
        assert "unknown command 'AUTH', with args beginning with: '(password)" in log, log
        assert password[:STORE_SECRET_RUN] not in log, log
    finally:
        rs.stop()


STORE_SECRET_RUN = 4    # store.c: the shortest start of the password cut


class EchoingServer(FakeRedis):
    """Answers AUTH with everything it was sent, and each script call with
    an error of hostile bytes that ends in what AUTH was sent: a server
    that is not Redis, or a proxy that echoes."""

    def __init__(self):
        self.auth = b""
        super().__init__(None)

    def answer(self, args):
        if args[0].upper() == b"AUTH":
            self.auth = b" ".join(args)
            return b"+OK\r\n" if self.keyed else b"-ERR got %s\r\n" % self.auth
        return super().answer(args)


def test_a_server_error_reaches_the_log_escaped_and_without_the_password(start_daemon):
    """Bytes of a server's error reply reached a text log raw (a terminal's
    escape sequences, invalid UTF-8, quotes), though the README says every
    untrusted byte is escaped; and the password in an echo went with them."""
    fake = EchoingServer()
    try:
        d = start_daemon(policy(route("r", "/"), redis="  password_env: RL_TEST_PW\n"),
                         redis_port=fake.port, env={"RL_TEST_PW": PASSWORD}, wait_ready=False)
        assert wait_until(lambda: "AUTH failed" in d.log(), timeout=5), d.log()
        assert "AUTH failed: ERR got AUTH (password)" in d.log(), d.log()
        # through the handshake now; each script call answered with an error
        fake.keyed = b"-ERR bad \xff\x1b[31m \"q\" b\\s " + PASSWORD.encode() + b"\r\n"
        assert wait_until(lambda: check(d, "/check/x").headers["X-RateLimit-Remaining"] == "-1"
                          and "error on route r" in d.log(), timeout=5), d.log()
        with open(d.log_path, "rb") as f:
            raw = f.read()
        assert b"\x1b" not in raw and b"\xff" not in raw, raw[-600:]
        assert PASSWORD.encode() not in raw and PASSWORD[:STORE_SECRET_RUN].encode() not in raw
        line = [l for l in raw.decode().splitlines() if "error on route r" in l][0]
        assert line.endswith('error on route r: ERR bad \\xff\\x1b[31m \\"q\\" b\\\\s '
                             '(password)'), line
    finally:
        fake.close()


@pytest.mark.parametrize("username, password, shown", [
    # an echo longer than the text kept: cut short, the rest unseen (a
    # review: it was logged whole, password and all, when nothing had been
    # cut before the cut-off)
    ("u" * 600, PASSWORD, "ERR got AUTH uuu"),
    # a password too short to cut out of a text Redis words alike each
    # time: the text is not shown
    (None, "ab", "(not shown: the server's text holds the password's characters)"),
])
def test_a_long_echo_or_a_short_password_never_shows_it(start_daemon, username, password,
                                                         shown):
    fake = EchoingServer()
    redis = "  password_env: RL_TEST_PW\n" + ("  username: %s\n" % username if username else "")
    try:
        d = start_daemon(policy(route("r", "/"), redis=redis), redis_port=fake.port,
                         env={"RL_TEST_PW": password}, wait_ready=False)
        assert wait_until(lambda: "AUTH failed" in d.log(), timeout=5), d.log()
        line = [l for l in d.log().splitlines() if "AUTH failed" in l][0]
        assert shown in line and password not in line.split("AUTH failed", 1)[1], line
    finally:
        fake.close()


def test_an_acl_that_keeps_one_route_s_keys_does_not_drop_the_link(start_daemon,
                                                                   redis_server):
    """Redis 7 refuses a whole EVALSHA with NOPERM for one declared key the
    ACL keeps from the user: that is that call's error, not EVALSHA taken
    away (a review: every such check dropped the link, failing the other
    routes' checks in flight, and logged a refusal each second)."""
    rc = redis_server.client()
    rc.execute_command("ACL", "SETUSER", "rl", "on", ">rl-pw", "~rl:{a:*", "+@all")
    d = start_daemon(policy(route("a", "/a/") + route("b", "/b/"),
                            redis="  username: rl\n  password_env: RL_PW\n"),
                     env={"RL_PW": "rl-pw"})
    for _ in range(5):
        assert check(d, "/check/b/x").headers["X-RateLimit-Remaining"] == "-1"
        assert check(d, "/check/a/x").headers["X-RateLimit-Remaining"] != "-1"
    assert ready(d), d.log()
    assert "EVALSHA of the limits script failed" not in d.log(), d.log()
    assert "permissions to access one of the keys" in d.log(), d.log()
    assert d.log().count(": connected") == 1, d.log()


def test_a_user_who_may_not_load_scripts_is_told_so(start_daemon, redis_server):
    """An ACL user without the scripting commands (a common hardening):
    the handshake's SCRIPT LOAD is refused. The log names that step and
    Redis's reason, once, and checks fail open while it lasts; granted the
    commands, the link comes up on its next attempt."""
    rc = redis_server.client()
    rc.execute_command("ACL", "SETUSER", "rl", "on", ">rl-pw", "~*", "+@all", "-@scripting")
    try:
        d = start_daemon(policy(route("r", "/"), redis="  username: rl\n  password_env: RL_PW\n"),
                         env={"RL_PW": "rl-pw"}, wait_ready=False)
        assert wait_until(lambda: "SCRIPT LOAD failed" in d.log(), timeout=3), d.log()
        time.sleep(1.2)                     # a few retries, backing off
        log = d.log()
        assert log.count("SCRIPT LOAD failed: NOPERM") == 1, log
        assert requests.get(d.url("/readyz"), timeout=2).status_code == 503
        assert_fail_open(d, n=2)
        assert all_keys(rc) == set()
        rc.execute_command("ACL", "SETUSER", "rl", "+@scripting")
        assert wait_until(lambda: ready(d), timeout=3), d.log()
        assert check(d, "/check/x").headers["X-RateLimit-Remaining"] == "4"
    finally:
        rc.execute_command("ACL", "DELUSER", "rl")


def test_a_redis_host_that_does_not_resolve_fails_open_and_says_so(start_daemon):
    """A host name is looked up at each attempt: one that does not resolve
    (.invalid never does, RFC 6761) is logged once, with the resolver's
    reason, and the daemon serves, failing open, meanwhile."""
    pol = policy(route("r", "/"), redis="  connect_timeout: 3s\n")     # a slow resolver
    d = start_daemon(pol.replace("127.0.0.1:{redis_port}", "no-such-redis.invalid:6379"),
                     wait_ready=False)
    assert wait_until(lambda: "cannot resolve the host" in d.log(), timeout=8), d.log()
    time.sleep(1.2)
    log = d.log()
    assert log.count("cannot resolve the host") == 1, log
    assert "no-such-redis.invalid" in log.split("cannot resolve the host", 1)[0].splitlines()[-1]
    assert requests.get(d.url("/readyz"), timeout=2).status_code == 503
    assert_fail_open(d, n=2)
    assert healthy(d)


def test_password_against_redis_without_one_never_comes_up(start_daemon, redis_server):
    """A Redis without a password refuses AUTH but runs what follows it
    (SCRIPT LOAD): the link must not come up on those replies. One line in
    the log, no "connected", retries backing off, checks failing open."""
    rc = redis_server.client()
    before = rc.info("stats")["total_connections_received"]
    d = start_daemon(SIMPLE, env={"REDIS_PASSWORD": "not-configured-on-redis"},
                     wait_ready=False)
    time.sleep(1.6)
    assert requests.get(d.url("/readyz"), timeout=2).status_code == 503
    assert_fail_open(d, n=2)
    log = d.log()
    assert log.count("AUTH failed") == 1, log
    assert "connected" not in log.replace("disconnected", ""), log
    assert "not-configured-on-redis" not in log
    # retries back off (50 ms, 100 ms, ... 1 s): a handful of connections in
    # 1.6 s, not one every 50 ms
    attempts = rc.info("stats")["total_connections_received"] - before
    assert attempts <= 12, attempts


def test_redis_reasons_for_refusing_are_logged(start_daemon, redis_server):
    """A Redis that needs a password the daemon was not given answers
    NOAUTH; one at maxclients says so before it closes. The log must name
    that reason, once, not what it led to (SCRIPT LOAD's protocol error,
    a reset connection)."""
    rc = redis_server.client()
    rc.config_set("requirepass", PASSWORD)
    try:
        d = start_daemon(SIMPLE, wait_ready=False)
        assert wait_until(lambda: "NOAUTH" in d.log(), timeout=3), d.log()
        time.sleep(0.5)
        log = d.log()
        assert log.count("INFO failed: NOAUTH") == 1, log
        # the variable named, as it is the one to set (the hint said to
        # set redis.password_env, which was set)
        assert "this Redis wants a password: REDIS_PASSWORD, the variable " \
            "redis.password_env names, is unset or empty" in log, log
        assert "Protocol error" not in log and "SCRIPT LOAD" not in log, log
    finally:
        rc = redis.Redis(host="127.0.0.1", port=redis_server.port, password=PASSWORD)
        rc.config_set("requirepass", "")


def test_readyz_needs_every_worker(start_daemon, redis_server):
    """/readyz says what ratelimitd_redis_connected says, whichever worker
    answers it: with room in Redis for one worker's link only, 503 every
    time, then 200 once both are up."""
    rc = redis_server.client()
    rc.ping()
    rc.config_set("maxclients", 2)           # this client and one worker
    try:
        d = start_daemon(policy(route("r", "/"), server="  workers: 2\n"),
                         wait_ready=False)
        assert wait_until(lambda: "max number of clients reached" in d.log(),
                          timeout=3), d.log()
        statuses = [requests.get(d.url("/readyz"), timeout=2).status_code
                    for _ in range(20)]
        assert statuses == [503] * 20, statuses
        metrics = requests.get(d.url("/metrics"), timeout=2).text
        assert "ratelimitd_redis_connected 0" in metrics
    finally:
        rc.config_set("maxclients", 10000)
    assert wait_until(lambda: requests.get(d.url("/readyz"), timeout=2).status_code == 200,
                      timeout=3), d.log()
    assert "ratelimitd_redis_connected 1" in requests.get(d.url("/metrics"), timeout=2).text


def slow_dns(tmp_path, **env):
    """The environment that preloads tests/tools/slow_dns.c into the daemon
    (ASan, if the binary has it, is told the preload is deliberate)."""
    lib = os.path.join(str(tmp_path), "slow_dns.so")
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", lib,
                    os.path.join(ROOT, "tests", "tools", "slow_dns.c"), "-ldl"],
                   check=True)
    asan = os.environ.get("ASAN_OPTIONS", "")
    return dict(env, LD_PRELOAD=lib,
                ASAN_OPTIONS=(asan + ":" if asan else "") + "verify_asan_link_order=0")


@pytest.mark.parametrize("fail", [False, True])
def test_slow_name_lookup_never_stalls_the_worker(start_daemon, redis_server, tmp_path, fail):
    """redis.address names a host whose lookup takes 1.5 s (and then
    resolves, or fails). hiredis 0.14 looks names up inside its connect,
    blocking: every check and /healthz waited for the resolver, at each
    reconnect. Checks must fail open at once meanwhile, and limiting start
    once the name resolves."""
    env = slow_dns(tmp_path, SLOW_DNS_NAME="slowredis.test", SLOW_DNS_MS="1500",
                   **({"SLOW_DNS_FAIL": "1"} if fail else {}))
    pol = policy(route("r", "/")).replace("127.0.0.1:{redis_port}",
                                          "slowredis.test:{redis_port}")
    assert "slowredis.test" in pol
    d = start_daemon(pol, wait_ready=False, env=env)
    t_end = time.monotonic() + 1.2
    while time.monotonic() < t_end:
        t0 = time.monotonic()
        assert requests.get(d.url("/healthz"), timeout=5).ok
        assert time.monotonic() - t0 < 0.2
        r, dt = timed_check(d)
        assert r.headers["X-RateLimit-Remaining"] == "-1" and dt < 0.2, dt
    if fail:
        time.sleep(1.0)
        assert requests.get(d.url("/readyz"), timeout=2).status_code == 503
        assert_fail_open(d, n=2)
        assert "connected" not in d.log(), d.log()
    else:
        assert wait_until(lambda: limited_again(d), timeout=5), d.log()
        assert requests.get(d.url("/readyz"), timeout=2).status_code == 200
    assert d.log().count("not resolved within connect_timeout") == 1, d.log()


def test_name_with_ipv6_first_reaches_an_ipv4_redis(start_daemon, redis_server, tmp_path):
    """A name that resolves like localhost in a stock /etc/hosts (::1
    first) must reach a Redis bound to 127.0.0.1: IPv4 first, as hiredis
    tries them."""
    env = slow_dns(tmp_path, SLOW_DNS_NAME="dualhost.test", SLOW_DNS_MS="0",
                   SLOW_DNS_V6_FIRST="1")
    pol = policy(route("r", "/")).replace("127.0.0.1:{redis_port}",
                                          "dualhost.test:{redis_port}")
    d = start_daemon(pol, wait_ready=False, env=env)
    assert wait_until(lambda: limited_again(d), timeout=3), d.log()


def test_database_selected(start_daemon, redis_server):
    d = start_daemon(policy(route("r", "/"), redis="  database: 3\n"))
    assert check(d, "/check/x").headers["X-RateLimit-Remaining"] == "4"
    assert all_keys(redis_server.client()) == set()
    import redis as redislib
    db3 = redislib.Redis(host="127.0.0.1", port=redis_server.port, db=3)
    assert all_keys(db3) == {rkey("r", "127.0.0.1", "q", "fixed_window")}


# ---------------------------------------------------------------- more faults

def test_redis_error_reply_fails_open_for_that_client_only(start_daemon, redis_server):
    d = start_daemon(SIMPLE)
    rc = redis_server.client()
    bad = rkey("r", "203.0.113.66", "q", "fixed_window")
    rc.rpush(bad, "not", "a", "hash")     # WRONGTYPE inside the script
    for _ in range(3):
        r, dt = timed_check(d, headers={"X-Forwarded-For": "203.0.113.66"})
        assert r.status_code == 200
        assert r.headers["X-RateLimit-Remaining"] == "-1"
        assert dt < TIMEOUT_S + SLACK_S
    assert rc.type(bad) == b"list" and rc.llen(bad) == 3
    # other clients are unaffected, and Redis stays usable
    r = check(d, "/check/x", "GET", {"X-Forwarded-For": "203.0.113.67"})
    assert r.status_code == 200 and r.headers["X-RateLimit-Remaining"] == "4"
    assert requests.get(d.url("/readyz"), timeout=2).status_code == 200


def test_redis_error_replies_logged_once_a_second(start_daemon, redis_server):
    """Redis refusing every write (OOM under maxmemory) fails every check
    alike: each is answered by the failure mode and counted, but the log
    gets one line a second, not one per check."""
    d = start_daemon(SIMPLE)
    rc = redis_server.client()
    rc.config_set("maxmemory-policy", "noeviction")
    rc.config_set("maxmemory", "1")
    try:
        with requests.Session() as s:
            for i in range(200):
                r = s.get(d.url("/check/x"), headers={"X-Forwarded-For": "203.0.113.%d" % (i % 250)},
                          timeout=5)
                assert r.status_code == 200 and r.headers["X-RateLimit-Remaining"] == "-1"
            lines = [l for l in d.log().splitlines()
                     if re.search(r": error( \d+ ms ago)? on route", l)]
            assert 1 <= len(lines) <= 2, lines
            assert "OOM" in lines[0]
            assert "worker 0: redis 127.0.0.1:%d: error on route r: OOM" % (
                redis_server.port) in lines[0], lines
        # The burst is over: within a second the errors held back are told,
        # with no further check to carry them; the lines account for all.
        time.sleep(1.2)
        lines = [l for l in d.log().splitlines()
                     if re.search(r": error( \d+ ms ago)? on route", l)]
        assert re.search(r"more Redis errors?, of any route or kind, since the last such line",
                         lines[-1]), lines
        told = sum(1 + int(m.group(1)) if m else 1 for m in
                   (re.search(r"\(and (\d+) more Redis errors?", l) for l in lines))
        assert told == 200, lines
        m = requests.get(d.url("/metrics"), timeout=2).text
        assert 'ratelimitd_redis_errors_total{kind="error"} 200' in m, m
    finally:
        rc.config_set("maxmemory", "0")
    assert wait_until(lambda: limited_again(d), timeout=3), d.log()


@pytest.mark.parametrize("policy_, maxmemory, warned", [
    ("allkeys-lru", "100mb", True), ("volatile-ttl", "100mb", True),
    ("allkeys-lru", "0", False), ("noeviction", "100mb", False)])
def test_a_redis_that_evicts_is_named_at_connect(start_daemon, redis_server,
                                                 policy_, maxmemory, warned):
    """An evicting maxmemory-policy drops a limit's count without a word
    and its client gets its whole quota back (an audit: no log line, no
    metric). Every key has a TTL, so volatile-* evicts them too. The daemon
    reads the policy from the INFO of its handshake and says so, once."""
    rc = redis_server.client()
    rc.config_set("maxmemory-policy", policy_)
    rc.config_set("maxmemory", maxmemory)
    try:
        # two workers' links find it: one line for the process
        d = start_daemon(SIMPLE.replace("server:\n", "server:\n  workers: 2\n", 1))
        assert check(d, "/check/x").headers["X-RateLimit-Remaining"] == "4"
        lines = [l for l in d.log().splitlines() if "evicts keys" in l]
        if warned:
            assert len(lines) == 1, d.log()
            assert ("this Redis evicts keys when full (maxmemory-policy %s, "
                    "maxmemory 104857600 bytes)" % policy_) in lines[0], lines
            assert "set maxmemory-policy noeviction" in lines[0], lines
            # Said once while it lasts, not at every reconnect.
            rc.client_kill_filter(_type="normal", skipme=True)
            assert wait_until(lambda: len(re.findall(r"(?<!dis)connected", d.log())) >= 4,
                              timeout=5), d.log()
            assert d.log().count("evicts keys") == 1, d.log()
        else:
            assert lines == [], lines
    finally:
        rc.config_set("maxmemory", "0")
        rc.config_set("maxmemory-policy", "noeviction")


def test_redis_error_reply_fails_closed(start_daemon, redis_server):
    d = start_daemon(SIMPLE.replace("routes:\n", "failure_mode: closed\nroutes:\n"))
    redis_server.client().set(rkey("r", "127.0.0.1", "q", "fixed_window"), "x")
    r = check(d, "/check/x")
    assert r.status_code == 503 and r.headers["X-RateLimit-Remaining"] == "-1"


@pytest.mark.parametrize("timeout_ms", [20, 200])
def test_deadline_follows_policy_timeout(start_daemon, redis_server, timeout_ms):
    d = start_daemon(policy(route("r", "/"), timeout="%dms" % timeout_ms))
    assert check(d, "/check/x").status_code == 200
    redis_server.pause()
    try:
        for _ in range(3):
            r, dt = timed_check(d)
            assert r.status_code == 200 and r.headers["X-RateLimit-Remaining"] == "-1"
            assert dt < timeout_ms / 1000.0 + SLACK_S, dt
    finally:
        redis_server.resume()


def test_redis_unix_socket(start_daemon, tmp_path):
    sock = os.path.join(str(tmp_path), "redis.sock")
    rs = ArgsRedis(tmp_path, extra=["--unixsocket", sock, "--unixsocketperm", "700"]).start()
    try:
        pol = policy(route("r", "/")).replace("127.0.0.1:{redis_port}", "unix:" + sock)
        d = start_daemon(pol, redis_port=rs.port, wait_ready=False)
        assert wait_until(lambda: requests.get(d.url("/readyz"), timeout=2).status_code == 200,
                          timeout=3), d.log()
        assert check(d, "/check/x").headers["X-RateLimit-Remaining"] == "4"
        assert rkey("r", "127.0.0.1", "q", "fixed_window") in all_keys(rs.client())
    finally:
        rs.stop()


def test_redis_acl_username(start_daemon, tmp_path):
    rs = ArgsRedis(tmp_path, extra=["--requirepass", PASSWORD], password=PASSWORD).start()
    try:
        rs.client().execute_command("ACL", "SETUSER", "rluser", "on", ">user-pw-5521",
                                    "~*", "+@all")
        d = start_daemon(policy(route("r", "/"),
                                redis="  username: rluser\n  password_env: RL_USER_PW\n"),
                         redis_port=rs.port, env={"RL_USER_PW": "user-pw-5521"})
        assert check(d, "/check/x").headers["X-RateLimit-Remaining"] == "4"
        clients = rs.client().execute_command("CLIENT", "LIST").decode()
        assert "user=rluser" in clients
        assert "user-pw-5521" not in requests.get(d.url("/v1/policy"), timeout=2).text
    finally:
        rs.stop()


def test_reply_for_client_that_went_away(start_daemon, redis_server):
    """Redis answers (within the deadline) checks whose clients have closed
    or reset their connections: the daemon must not touch freed requests."""
    d = start_daemon(policy(route("r", "/", limit=1000), timeout="2s"))
    redis_server.pause()
    try:
        for i in range(40):
            s = socket.create_connection(("127.0.0.1", d.port))
            if i % 2:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                             b"\x01\x00\x00\x00\x00\x00\x00\x00")
            body = b'{"route":"r","key":"gone-away"}'
            s.sendall(b"GET /check/x HTTP/1.1\r\nHost: x\r\n\r\n"
                      if i % 3 else
                      b"POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
                      % (len(body), body))
            time.sleep(0.005)
            s.close()
        time.sleep(0.3)
    finally:
        redis_server.resume()
    time.sleep(0.3)
    assert d.alive(), d.log()
    assert healthy(d)
    r = check(d, "/check/x")
    assert r.status_code == 200 and int(r.headers["X-RateLimit-Remaining"]) >= 0


def test_no_connect_attempt_per_request_while_redis_hangs(start_daemon, redis_server, tmp_path):
    """SPEC §8: while Redis is unusable, checks fail fast without a connect
    attempt each. A stopped redis-server still completes TCP handshakes
    (the kernel's accept queue), and counts them once it resumes."""
    d = start_daemon(SIMPLE)
    redis_server.kill()
    assert_fail_open(d, n=20)
    hung = RedisServer(tmp_path, port=redis_server.port).start()
    try:
        c = hung.client()
        before = c.info("stats")["total_connections_received"]
        hung.pause()
        try:
            t_end = time.monotonic() + 1.0
            n = 0
            while time.monotonic() < t_end:
                r, dt = timed_check(d)
                assert r.status_code == 200 and dt < TIMEOUT_S + SLACK_S
                n += 1
        finally:
            hung.resume()
        assert n >= 10
        time.sleep(0.2)
        after = hung.client().info("stats")["total_connections_received"]
        # our own two clients, plus a few (backed-off) daemon attempts
        assert after - before <= 2 + 8, (after - before, n)
    finally:
        hung.stop()


def test_redis_killed_under_load(start_daemon, redis_server):
    d = start_daemon(policy(route("r", "/", limit=100000)))
    results, errors = [], []
    stop = time.monotonic() + 1.5

    def worker():
        s = requests.Session()
        while time.monotonic() < stop:
            try:
                t0 = time.monotonic()
                r = s.get(d.url("/check/x"), timeout=5)
                results.append((r.status_code, r.headers.get("X-RateLimit-Remaining"),
                                time.monotonic() - t0))
            except Exception as e:   # noqa: BLE001
                errors.append(repr(e))
    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    time.sleep(0.5)
    redis_server.kill()
    for t in threads:
        t.join(10)
    assert not errors, errors[:3]
    assert {s for s, _, _ in results} == {200}
    assert any(rem == "-1" for _, rem, _ in results)
    assert any(rem not in (None, "-1") for _, rem, _ in results)
    # 8 concurrent Python clients on 2 cores: generous
    assert max(dt for _, _, dt in results) < TIMEOUT_S + 4 * SLACK_S
    assert healthy(d)


def test_connection_killed_by_redis_reconnects(start_daemon, redis_server):
    d = start_daemon(SIMPLE)
    assert check(d, "/check/x").headers["X-RateLimit-Remaining"] == "4"
    c = redis_server.client()
    killed = c.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
    assert killed >= 1
    assert wait_until(lambda: limited_again(d), timeout=3), d.log()
    r = check(d, "/check/x")
    assert r.headers["X-RateLimit-Remaining"] in ("3", "2", "1", "0")


# Keeps Redis busy 0.3 s (DEBUG SLEEP is off by default in Redis 7).
BUSY_300MS = ("local s = redis.call('TIME') local t0 = s[1] * 1e6 + s[2] "
              "while true do local t = redis.call('TIME') "
              "if t[1] * 1e6 + t[2] - t0 > 300000 then break end end return 1")


def test_slow_redis_within_deadline_is_not_degraded(start_daemon, redis_server):
    d = start_daemon(policy(route("r", "/"), timeout="1s"))
    assert check(d, "/check/x").headers["X-RateLimit-Remaining"] == "4"
    c = redis_server.client()
    c.ping()
    sleeper = threading.Thread(target=lambda: c.eval(BUSY_300MS, 0))
    sleeper.start()
    time.sleep(0.05)
    r, dt = timed_check(d)
    sleeper.join()
    assert r.status_code == 200
    assert r.headers["X-RateLimit-Remaining"] == "3", "answered degraded before the deadline"
    assert 0.1 < dt < 1.0 + SLACK_S, dt


def test_redis_flapping(start_daemon, redis_server, tmp_path):
    d = start_daemon(SIMPLE)
    port = redis_server.port
    redis_server.kill()
    for _ in range(4):
        back = RedisServer(tmp_path, port=port).start()
        assert wait_until(lambda: limited_again(d), timeout=3), d.log()
        back.kill()
        assert_fail_open(d, n=2)
    assert healthy(d)


def test_many_checks_held_by_a_paused_redis(start_daemon, redis_server):
    """Thousands of checks time out while Redis is stopped; each is answered
    at its deadline, and their late replies are dropped once Redis resumes."""
    from helpers import hammer
    d = start_daemon(policy(route("r", "/", limit=10 ** 9)))
    redis_server.pause()
    try:
        t0 = time.monotonic()
        res = hammer([(d.url("/check/x"), {"X-Forwarded-For": "198.51.100.%d" % (i % 200)})
                      for i in range(2000)], workers=100)
        took = time.monotonic() - t0
    finally:
        redis_server.resume()
    assert {s for s, _ in res} == {200}
    assert {rem for _, rem in res} == {"-1"}
    assert took < 30, took
    assert wait_until(lambda: limited_again(d), timeout=3), d.log()
    assert healthy(d)


def test_redis_slower_than_the_traffic_keeps_no_backlog(start_daemon, redis_server, tmp_path):
    """A Redis that answers, but slower than checks arrive (its replies
    trickle through at 20 KB/s, some 300 checks a second): once the oldest
    call with it is redis.timeout old, a new check would only wait behind
    it, so it is answered at once by the failure mode and not sent. Before,
    every check was sent and waited its timeout: the backlog grew with the
    traffic (1.6 GB in 17 s at 2,000 connections), and checks kept failing
    open for minutes after the traffic stopped, until Redis had worked
    through it."""
    if shutil.which("wrk") is None:
        pytest.skip("wrk is not installed")
    proxy = TrickledReplies(redis_server.port, 20000)
    try:
        d = start_daemon(policy(route("r", "/", limit=10 ** 9)).replace(
            "127.0.0.1:{redis_port}", "127.0.0.1:%d" % proxy.port))
        assert check(d, "/check/x").headers["X-RateLimit-Remaining"] != "-1"
        load = subprocess.Popen(["wrk", "-t1", "-c200", "-d3s", d.url("/check/x")],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        out, _ = load.communicate(timeout=20)
        assert b"Requests/sec" in out, out
        # The traffic has stopped: Redis has little to work through, and
        # checks get real answers again at once.
        t0 = time.monotonic()
        assert wait_until(lambda: check(d, "/check/x").headers["X-RateLimit-Remaining"]
                          != "-1", timeout=5, interval=0.05), d.log()
        assert time.monotonic() - t0 < 1.0, time.monotonic() - t0
        metrics = requests.get(d.url("/metrics"), timeout=5).text
        failed_open = sum(float(v) for v in re.findall(
            r'^ratelimitd_checks_total\{route="r",result="failed_open"\} (\S+)$',
            metrics, re.M))
        assert failed_open > 0, metrics
        assert healthy(d)
    finally:
        proxy.close()


def ready(d):
    return requests.get(d.url("/readyz"), timeout=2).status_code == 200


def test_a_replica_is_refused_and_a_failover_followed(start_daemon, redis_server, tmp_path):
    """Pointed at a replica, every check failed open (READONLY) while
    /readyz said up, and a primary demoted under a live link (a failover)
    failed every check until a restart. A replica is now refused in the
    handshake, with the fix, and the link retried: it comes up when the
    server is promoted, and goes when it is demoted again."""
    replica = RedisServer(tmp_path).start()
    try:
        replica.client().replicaof("127.0.0.1", redis_server.port)
        d = start_daemon(SIMPLE, redis_port=replica.port, wait_ready=False)
        assert wait_until(lambda: "role:slave" in d.log(), timeout=5), d.log()
        assert "INFO role check failed: this is a replica (role:slave), which cannot keep the " \
            "limits' counts: set redis.address to the primary" in d.log(), d.log()
        assert not ready(d)
        assert check(d, "/check/x").headers["X-RateLimit-Remaining"] == "-1"
        replica.client().replicaof("NO", "ONE")
        assert wait_until(lambda: ready(d), timeout=5), d.log()
        assert check(d, "/check/x").headers["X-RateLimit-Remaining"] == "4"
        replica.client().replicaof("127.0.0.1", redis_server.port)
        check(d, "/check/x")        # READONLY: the link is dropped
        assert wait_until(lambda: "the server is a replica now; reconnecting" in d.log(),
                          timeout=5), d.log()
        assert wait_until(lambda: not ready(d), timeout=5)
        assert d.log().count("READONLY: the server is a replica now") == 1, d.log()
    finally:
        replica.stop()


def test_a_sentinel_is_refused_with_the_fix(start_daemon, tmp_path):
    """A Sentinel answers the connection but runs no scripts: the log said
    SCRIPT LOAD failed with an unknown command."""
    port = RedisServer(tmp_path).port
    conf = os.path.join(str(tmp_path), "sentinel.conf")
    with open(conf, "w") as f:
        f.write("port %d\nbind 127.0.0.1\ndir %s\n" % (port, tmp_path))
    sentinel = subprocess.Popen(["redis-server", conf, "--sentinel"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert wait_until(lambda: redis.Redis(port=port, socket_timeout=1).ping(), timeout=5)
        d = start_daemon(SIMPLE, redis_port=port, wait_ready=False)
        assert wait_until(lambda: "Sentinel" in d.log(), timeout=5), d.log()
        assert "INFO role check failed: this is a Sentinel, not the Redis server: set " \
            "redis.address to the primary it names (SENTINEL get-master-addr-by-name)" \
            in d.log(), d.log()
        assert not ready(d)
    finally:
        sentinel.kill()
        sentinel.wait()


def test_a_replica_unseen_by_info_backs_off(start_daemon, redis_server, tmp_path):
    """An ACL user without INFO (+@all -@dangerous) cannot see the role, and
    the zero-check probe is answered by a replica: each check's READONLY
    dropped the link, the next handshake logged "connected" and reset the
    backoff, so every check cost a connection and two log lines (found by
    a review). The drops now back off and are one outage in the log; a
    denial, which writes nothing and which a replica answers, is no
    recovery either (a second review: it reset the backoff)."""
    primary = start_daemon(SIMPLE)
    for _ in range(6):      # 10.0.0.1 over its limit, on the primary
        vcheck(primary, {"route": "r", "key": "10.0.0.1"})
    replica = RedisServer(tmp_path).start()
    try:
        rc = replica.client()
        rc.execute_command("ACL", "SETUSER", "noinfo", "on", ">noinfo-pw", "~*",
                           "+@all", "-info")
        rc.replicaof("127.0.0.1", redis_server.port)
        assert wait_until(lambda: rc.dbsize() > 0, timeout=10)
        d = start_daemon(policy(route("r", "/"),
                                redis="  username: noinfo\n  password_env: RL_NOINFO\n"),
                         redis_port=replica.port, env={"RL_NOINFO": "noinfo-pw"})
        conns0 = rc.info("stats")["total_connections_received"]
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            vcheck(d, {"route": "r", "key": "10.0.0.1"})     # denied, read only
            r = vcheck(d, {"route": "r", "key": "10.0.0.2"})
            assert r.status_code == 200 and r.json()["degraded"] is True, r.text
            time.sleep(0.05)
        log = d.log()
        assert log.count("READONLY: the server is a replica now") == 1, log
        assert log.count(": connected") == 1, log
        assert "answering again" not in log, log
        # backoff from 50 ms to 1 s: about 6 links in 3 s, not one per check
        assert rc.info("stats")["total_connections_received"] - conns0 <= 10, log
    finally:
        replica.stop()


@pytest.mark.parametrize("greeting", [b"+OK\r\n" * 10, b"+OK POP3 ready\r\n"])
def test_a_server_that_is_not_redis_never_takes_the_daemon_down(start_daemon, greeting):
    """hiredis 0.14 aborts on a reply that no command awaits: a peer that
    answered "+OK" per line killed the daemon at its handshake (found by
    an audit). Now the link is refused, and checks fail open."""
    fake = FakeRedis(None, greeting=greeting)
    try:
        d = start_daemon(SIMPLE, redis_port=fake.port, wait_ready=False)
        assert wait_until(lambda: "not Redis" in d.log(), timeout=5), d.log()
        time.sleep(0.5)
        assert d.proc.poll() is None, d.log()
        assert_fail_open(d, n=3)
        assert not ready(d)
    finally:
        fake.close()


def test_two_replies_to_one_call_never_take_the_daemon_down(start_daemon):
    """A peer that passes the handshake and answers a script call twice
    (a proxy that garbles): the first reply fails its checks open, the
    second, which no call awaits, drops the link, logged once."""
    fake = FakeRedis(b"*0\r\n*0\r\n")
    try:
        d = start_daemon(SIMPLE, redis_port=fake.port)
        for _ in range(5):
            assert_fail_open(d, n=1)
            time.sleep(0.05)
        assert d.proc.poll() is None, d.log()
        assert d.log().count("sent a reply that no command asked for") == 1, d.log()
    finally:
        fake.close()


@pytest.mark.parametrize("header", [b"*2000000000\r\n", b"*1\r\n*3\r\n"])
def test_an_array_no_call_gets_drops_the_link_at_its_header(start_daemon, header):
    """hiredis makes an array when it reads the header: a peer that sent
    "*200000000" alone had the worker zero 1.6 GB (3.8 s without an
    answer, /healthz too), and the memory was kept (an audit). An array
    longer than any batch's reply, or nested, now drops the link at once."""
    fake = FakeRedis(header)
    try:
        d = start_daemon(SIMPLE, redis_port=fake.port)
        t0 = time.monotonic()
        assert_fail_open(d, n=1)
        assert requests.get(d.url("/healthz"), timeout=2).status_code == 200
        assert time.monotonic() - t0 < 1, d.log()
        assert wait_until(lambda: "began a reply no call of ours gets" in d.log(),
                          timeout=3), d.log()
    finally:
        fake.close()


def test_a_link_broken_by_every_call_backs_off(start_daemon):
    """A peer that takes the handshake and answers each script call with a
    protocol error: each handshake reset the backoff and logged
    "connected", so the daemon reconnected every 60 ms, with two log
    lines each time (an audit: 78 links in 5 s). The links now back off
    to a second apart and are one outage in the log; once one holds a
    second, that is said and the backoff starts again from 50 ms."""
    fake = FakeRedis(b"!!!garbage\r\n")
    try:
        d = start_daemon(SIMPLE, redis_port=fake.port)
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            r = check(d, "/check/x")
            assert r.status_code == 200 and r.headers["X-RateLimit-Remaining"] == "-1"
            time.sleep(0.02)
        log = d.log()
        # 50 ms, 100 ms ... 800 ms: about 6 links in 2 s, not 30
        assert fake.links <= 8, (fake.links, log)
        assert log.count(": connected") == 1, log
        assert log.count("disconnected") == 1, log
        # the peer mends (an error reply is an answer): the link holds
        fake.keyed = b"-ERR mended\r\n"
        assert wait_until(lambda: "link has held" in d.log(), timeout=4), d.log()
        assert d.proc.poll() is None, d.log()
    finally:
        fake.close()


@pytest.mark.parametrize("stalled, more", [(4, "2 more Redis errors"),
                                           (3, "1 more Redis error")])
def test_a_stall_shorter_than_the_watchdog_is_logged(start_daemon, redis_server,
                                                     stalled, more):
    """Redis stalled a moment: its checks fail open on their deadline, too soon
    for the watchdog (1 s) to say anything, and the log said nothing at
    all (an audit). The timeouts are now told like error replies: a line
    a second at most, with how many it stands for (one in the singular)."""
    d = start_daemon(SIMPLE)
    assert check(d, "/check/x").headers["X-RateLimit-Remaining"] == "4"
    redis_server.pause()
    try:
        for _ in range(stalled):
            assert check(d, "/check/x").headers["X-RateLimit-Remaining"] == "-1"
    finally:
        redis_server.resume()
    assert wait_until(lambda: "more Redis error" in d.log(), timeout=3), d.log()
    lines = [l for l in d.log().splitlines() if "redis.timeout (50 ms)" in l]
    assert len(lines) == 2, d.log()     # the first at once, the rest a second later
    assert lines[0].endswith("error on route r: no reply within redis.timeout (50 ms)"), lines
    # the second, a second later, says its latest error is not news
    assert re.search(r": error \d+ ms ago on route r: ", lines[1]), lines
    # behind the first, the others were not sent (the log names the last)
    assert lines[1].endswith("on route r: not sent: a call has waited "
                             "redis.timeout (50 ms) for its reply (and %s, of any "
                             "route or kind, since the last such line)" % more), lines


def test_an_idle_link_is_kept_alive(start_daemon, redis_server):
    """A Redis `timeout` (or a NAT that forgets idle flows) closed an idle
    daemon's link, and the next check met it closed (an audit: Redis with
    `timeout 1` saw a reconnect every 2 s, and with PINGs 5 s apart
    `timeout 3` cycled the link every 4 s). An idle link is sent PING
    every second: under `timeout 2` the same client, its last command a
    PING."""
    d = start_daemon(SIMPLE)
    c = redis_server.client()
    c.config_set("timeout", 2)

    def daemon_clients():
        return [cl for cl in c.client_list() if cl["cmd"] != "client|list"]
    before = daemon_clients()
    assert len(before) == 1, before
    time.sleep(4.5)
    after = daemon_clients()
    assert [cl["id"] for cl in after] == [before[0]["id"]], (before, after)
    assert after[0]["cmd"] == "ping", after
    assert check(d, "/check/x").headers["X-RateLimit-Remaining"] == "4"


def test_a_user_without_evalsha_is_not_ready(start_daemon, redis_server):
    """An ACL user that may not run EVALSHA fails every check: the link's
    probe found that out and /readyz still said up (left open by an
    earlier review). The link is now refused, said once, and retried."""
    rc = redis_server.client()
    rc.execute_command("ACL", "SETUSER", "noeval", "on", ">noeval-pw", "~*",
                       "+@all", "-evalsha")
    d = start_daemon(policy(route("r", "/"),
                            redis="  username: noeval\n  password_env: RL_NOEVAL\n"),
                     env={"RL_NOEVAL": "noeval-pw"}, wait_ready=False)
    assert wait_until(lambda: "EVALSHA of the limits script failed: NOPERM" in d.log(),
                      timeout=5), d.log()
    time.sleep(1.5)
    assert not ready(d), d.log()
    assert d.log().count("NOPERM") == 1, d.log()
    assert_fail_open(d, n=3)
    # given the command, the next attempt takes the link up
    rc.execute_command("ACL", "SETUSER", "noeval", "+evalsha")
    assert wait_until(lambda: ready(d), timeout=5), d.log()


def test_evalsha_taken_from_the_user_while_linked_drops_the_link(start_daemon,
                                                                  redis_server):
    """EVALSHA revoked while the link was up: every check failed with
    NOPERM as kind "error" while /readyz said up and
    ratelimitd_redis_connected 1, until something else dropped the link
    (an audit; the alerting table says NOPERM drops it). It is refused as
    at a link's first call, and taken up again once allowed."""
    rc = redis_server.client()
    rc.execute_command("ACL", "SETUSER", "rl", "on", ">rl-pw", "~*", "+@all")
    d = start_daemon(policy(route("r", "/"),
                            redis="  username: rl\n  password_env: RL_PW\n"),
                     env={"RL_PW": "rl-pw"})
    assert check(d, "/check/x").headers["X-RateLimit-Remaining"] == "4"
    rc.execute_command("ACL", "SETUSER", "rl", "-evalsha")
    assert check(d, "/check/x").headers["X-RateLimit-Remaining"] == "-1"
    assert wait_until(lambda: not ready(d), timeout=3), d.log()
    assert "EVALSHA of the limits script failed: NOPERM" in d.log(), d.log()
    m = requests.get(d.url("/metrics"), timeout=2).text
    assert "ratelimitd_redis_connected 0" in m, m
    assert_fail_open(d, n=3)
    rc.execute_command("ACL", "SETUSER", "rl", "+evalsha")
    assert wait_until(lambda: ready(d), timeout=5), d.log()
    assert check(d, "/check/x").headers["X-RateLimit-Remaining"] == "3"
