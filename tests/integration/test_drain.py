"""Graceful stop (SPEC §2): SIGTERM/SIGINT stop accepting, finish the checks
in flight (at most server.drain_timeout), close Redis and exit 0. Checks in
flight are held by a leaky_bucket with `delay: true`, whose allowed replies
wait for their turn."""
import datetime
import signal
import socket
import threading
import time

import pytest
import requests

from conftest import wait_until
from ops_helpers import (check, ops_daemon, policy, route, scrape, terminate,  # noqa: F401
                         wait_exit)

SHAPED = '{algorithm: leaky_bucket, rate: "%s", burst: 5, delay: true}'


def shaped_policy(rate="2/s", drain="5s"):
    return policy(route("lb", "/lb/", SHAPED % rate),
                  server="  drain_timeout: %s\n" % drain)


def fire(d, n, key="held"):
    """n concurrent checks on fresh connections; returns (threads, results)
    where results[i] is (status, seconds) or the exception's repr."""
    results = [None] * n

    def one(i):
        t0 = time.monotonic()
        try:
            r = requests.get(d.url("/check/lb/x"), timeout=15,
                             headers={"X-Key": key, "Connection": "close"})
            results[i] = (r.status_code, time.monotonic() - t0,
                          r.headers.get("X-RateLimit-Remaining"))
        except requests.RequestException as e:
            results[i] = repr(e)
    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    return threads, results


def held(d, n):
    return wait_until(lambda: scrape(d).get("ratelimitd_in_flight") >= n, timeout=3)


def connect_refused(port):
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=0.5)
    except ConnectionRefusedError:
        return True
    s.close()
    return False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["TERM", "INT"])
def test_stop_answers_held_checks_and_exits_0(ops_daemon, sig):
    """rate 2/s, burst 5, five at once: one answered now, four held for
    0.5..2 s. The stop signal comes while they wait: all five are answered
    200 (allowed, not dropped), then the process exits 0 within
    drain_timeout + 1 s."""
    d = ops_daemon(shaped_policy("2/s", "5s"))
    threads, results = fire(d, 5)
    assert held(d, 4), "checks were not held"
    t0 = terminate(d, sig)
    for t in threads:
        t.join(15)
    code = wait_exit(d, 6.0 - (time.monotonic() - t0))
    took = time.monotonic() - t0
    assert results == [r for r in results if isinstance(r, tuple)], results
    assert [r[0] for r in results] == [200] * 5, results
    assert code == 0, "exit code %r after %.1fs:\n%s" % (code, took, d.log())
    assert took <= 5.0 + 1.0


def test_new_connections_refused_while_draining(ops_daemon):
    """Once the drain starts nobody new gets in: a connect is refused (not
    accepted into a backlog nobody serves) while held checks finish."""
    d = ops_daemon(shaped_policy("1/s", "5s"))
    threads, results = fire(d, 5)
    assert held(d, 4)
    terminate(d)
    try:
        refused = wait_until(lambda: connect_refused(d.port), timeout=1.0)
        still_draining = d.proc.poll() is None
    finally:
        for t in threads:
            t.join(15)
        wait_exit(d, 7)
    assert still_draining, "daemon exited before the held checks finished"
    assert refused, "a new connection was accepted 1 s into the drain"
    assert [r[0] if isinstance(r, tuple) else r for r in results] == [200] * 5


def test_drain_timeout_cuts_the_wait(ops_daemon):
    """rate 1/s, burst 5: the last held check would wait 4 s, but
    drain_timeout is 1s: every check is still answered, and the process
    exits 0 within drain_timeout + 1 s."""
    d = ops_daemon(shaped_policy("1/s", "1s"))
    threads, results = fire(d, 5)
    assert held(d, 4)
    t0 = terminate(d)
    code = wait_exit(d, 2.5)
    took = time.monotonic() - t0
    for t in threads:
        t.join(5)
    assert code == 0, "exit code %r after %.1fs:\n%s" % (code, took, d.log())
    assert took <= 1.0 + 1.0, took
    assert all(isinstance(r, tuple) for r in results), results
    # held checks were allowed by the limiter: cut short, they still pass
    assert [r[0] for r in results] == [200] * 5, results


def test_idle_keepalive_connection_does_not_block_exit(ops_daemon):
    d = ops_daemon(shaped_policy("2/s", "2s"))
    s = requests.Session()
    assert s.get(d.url("/healthz"), timeout=2).status_code == 200
    assert s.get(d.url("/check/lb/x"), headers={"X-Key": "k"}, timeout=2).status_code == 200
    t0 = terminate(d)
    code = wait_exit(d, 3.5)
    assert code == 0, d.log()
    assert time.monotonic() - t0 <= 2.0 + 1.0
    s.close()


def test_stop_with_redis_down_exits_0(ops_daemon, redis_server):
    d = ops_daemon(shaped_policy("2/s", "2s"))
    redis_server.kill()
    r = check(d, "/check/lb/x", headers={"X-Key": "k"})
    assert r.status_code == 200 and r.headers.get("X-RateLimit-Remaining") == "-1"
    t0 = terminate(d)
    assert wait_exit(d, 3.5) == 0, d.log()
    assert time.monotonic() - t0 <= 2.0 + 1.0


def test_two_workers_drain_and_ignore_sighup(ops_daemon):
    """workers: 2, checks held on both (two clients, five each), a SIGHUP
    during the drain changes nothing: every check answered 200, exit 0."""
    d = ops_daemon(policy(route("lb", "/lb/", SHAPED % "4/s"),
                          server="  workers: 2\n  drain_timeout: 5s\n"))
    t1, r1 = fire(d, 5, key="w1")
    t2, r2 = fire(d, 5, key="w2")
    # All ten in before the stop (else the last to connect is refused, as
    # it should be): each is answered already or held.
    assert wait_until(lambda: scrape(d).get("ratelimitd_in_flight") +
                      sum(r is not None for r in r1 + r2) >= 10, timeout=5)
    assert held(d, 1)
    t0 = terminate(d)
    time.sleep(0.1)
    d.signal(signal.SIGHUP)
    for t in t1 + t2:
        t.join(15)
    code = wait_exit(d, 6.0 - (time.monotonic() - t0))
    assert code == 0, d.log()
    assert [r[0] if isinstance(r, tuple) else r for r in r1 + r2] == [200] * 10


def read_reply(s, timeout=10):
    """One reply (head and Content-Length body) from socket s, as bytes."""
    s.settimeout(timeout)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(4096)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        body += s.recv(4096)
    return head


def test_stop_closes_idle_connections_and_ends_busy_ones_with_close(ops_daemon):
    """As nginx does when it exits: a keep-alive connection with nothing
    under way is closed at once, and a held check's reply says
    `Connection: close` and ends its connection. (Before, replies during
    the drain kept connections alive, and the gateway's next request on
    one was cut without an answer when the process exited.)"""
    d = ops_daemon(shaped_policy("2/s", "5s"))
    idle = socket.create_connection(("127.0.0.1", d.port), timeout=5)
    idle.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert b" 200 " in read_reply(idle)
    busy = socket.create_connection(("127.0.0.1", d.port), timeout=5)
    request = b"GET /check/lb/x HTTP/1.1\r\nHost: x\r\nX-Key: held\r\n\r\n"
    busy.sendall(request)
    assert b" 200 " in read_reply(busy)
    threads, results = fire(d, 3)       # held 0.5, 1 and 1.5 s
    assert held(d, 3)
    busy.sendall(request)               # held 2 s
    assert held(d, 4)
    t0 = terminate(d)
    try:
        idle.settimeout(2)
        assert idle.recv(100) == b"", "idle keep-alive connection left open"
        assert time.monotonic() - t0 < 1.5
        head = read_reply(busy)
        assert b" 200 " in head and b"\r\nConnection: close" in head, head
        busy.settimeout(2)
        assert busy.recv(100) == b"", "connection kept after its last reply"
    finally:
        for t in threads:
            t.join(15)
        idle.close()
        busy.close()
        assert wait_exit(d, 7) == 0, d.log()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["TERM", "INT"])
def test_second_signal_stops_at_once(ops_daemon, sig):
    """Ctrl-C twice: the second stop signal ends a drain that would wait
    up to 10 s. Every held check is still answered, and the exit is 0."""
    d = ops_daemon(shaped_policy("1/s", "10s"))
    threads, results = fire(d, 5)
    assert held(d, 4)
    terminate(d, sig)
    time.sleep(0.2)
    t0 = time.monotonic()
    d.signal(sig)
    code = wait_exit(d, 5)
    took = time.monotonic() - t0
    for t in threads:
        t.join(15)
    assert code == 0, "exit code %r:\n%s" % (code, d.log())
    assert took < 1.0, took
    assert [r[0] if isinstance(r, tuple) else r for r in results] == [200] * 5
    assert "again: answering what is left now" in d.log()


def test_second_signal_after_idle_workers_finished(ops_daemon):
    """Four workers, checks held on one connection (so on one worker): the
    three idle workers finish their drain within 0.1 s and free their
    events. A second SIGTERM after that must only reach the busy one (it
    touched the freed events and crashed, 20 runs in 20)."""
    d = ops_daemon(policy(route("lb", "/lb/", SHAPED % "6/m"),
                          server="  workers: 4\n  drain_timeout: 10s\n"))
    s = socket.create_connection(("127.0.0.1", d.port), timeout=10)
    try:
        for _ in range(3):
            s.sendall(b"GET /check/lb/x HTTP/1.1\r\nHost: x\r\nX-Key: one\r\n\r\n")
        assert held(d, 1)
        terminate(d)
        time.sleep(0.4)
        d.signal(signal.SIGTERM)
        assert wait_exit(d, 5) == 0, d.log()
    finally:
        s.close()


def log_time(d, text):
    """When the daemon logged the first line with text (its clock, to the ms)."""
    line = next(l for l in d.log().splitlines() if text in l)
    stamp = datetime.datetime.strptime(line.split(" ", 1)[0], "%Y-%m-%dT%H:%M:%S.%fZ")
    return stamp.timestamp()


def test_a_request_under_way_at_the_signal_is_answered(ops_daemon):
    """A head still arriving when the signal came is waited for within
    drain_timeout, as nginx waits for a header under way: it was cut off
    0.1 s after the signal with no reply, when nothing else was under
    way. Its reply says the drain (/readyz 503) and ends the connection;
    the process then exits at once."""
    d = ops_daemon(shaped_policy("2/s", "5s"))
    s = socket.create_connection(("127.0.0.1", d.port), timeout=5)
    try:
        s.sendall(b"GET /readyz HTTP/1.1\r\nHo")
        time.sleep(0.1)
        terminate(d)
        time.sleep(0.5)
        assert d.proc.poll() is None, "exited with a request under way"
        s.sendall(b"st: x\r\n\r\n")
        head = read_reply(s)
        assert head.startswith(b"HTTP/1.1 503 "), head
        assert b"\r\nConnection: close" in head, head
        assert wait_exit(d, 2) == 0, d.log()
    finally:
        s.close()


def test_daemon_with_nothing_to_finish_exits_at_once(ops_daemon):
    """With no check in flight and no reply going out, the drain is over at
    once: the process does not sit out a fixed 100 ms, a gap in which a
    gateway with this daemon as its only upstream fails every check (it
    could not connect, and the new daemon could not start yet). Best of
    three, for a busy machine. Timed by the daemon's own lines, from the
    signal's to "stopped": the sanitized build's exit adds its leak scan
    (some 70 ms here), which no gateway waits on but a stopwatch did."""
    took = []
    for _ in range(3):
        d = ops_daemon(shaped_policy("2/s", "5s"))
        s = requests.Session()
        assert s.get(d.url("/healthz"), timeout=2).status_code == 200   # kept alive
        terminate(d)
        assert wait_exit(d, 3) == 0, d.log()
        took.append(log_time(d, "info stopped") - log_time(d, "SIGTERM: draining"))
        s.close()
    assert min(took) < 0.05, took


def test_systemd_readiness_and_stopping_notifications(ops_daemon, tmp_path):
    """With $NOTIFY_SOCKET set (systemd, Type=notify), the daemon says
    READY=1 once it serves with its signal handlers in place, so that
    `systemctl reload` cannot send a SIGHUP before it can take one, and
    STOPPING=1 when a stop signal comes."""
    path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(10)
    try:
        d = ops_daemon(shaped_policy(), env={"NOTIFY_SOCKET": path})
        assert sock.recv(100) == b"READY=1"
        assert requests.get(d.url("/healthz"), timeout=2).status_code == 200
        terminate(d)
        assert sock.recv(100) == b"STOPPING=1"
        assert wait_exit(d, 5) == 0, d.log()
    finally:
        sock.close()


def test_a_signal_during_exit_keeps_the_exit_status(ops_daemon):
    """Freeing a signal's event put its default action back: a SIGTERM
    arriving while the daemon finished exiting (make run's trap forwards
    Ctrl-C as one) killed it, exit 143 instead of 0, in about half of the
    tries (seen as a failed make-run test). They are ignored from then on."""
    for i in range(12):
        d = ops_daemon(policy(route("api", "/api/", "{name: q, algorithm: fixed_window, "
                                                    "limit: 5, window: 1h}")))
        assert wait_until(lambda: "listening on" in d.log(), timeout=5)
        terminate(d, signal.SIGINT)
        time.sleep(0.001 * (i % 6))
        try:
            d.signal(signal.SIGTERM)
        except ProcessLookupError:
            pass
        assert d.proc.wait(10) == 0, (i, d.log())


def test_verdict_after_stop_does_not_pass_ahead_of_held_checks(ops_daemon, redis_server):
    """Checks still with Redis when the stop comes are shaped like the ones
    already held: released at drain_timeout with them, not answered the
    moment their verdict arrives, ahead of checks whose turn was earlier."""
    d = ops_daemon(policy(route("lb", "/lb/", SHAPED.replace("burst: 5", "burst: 20")
                                % "1/10s"),
                          server="  drain_timeout: 2s\n", timeout="2s"))
    request = b"GET /check/lb/x HTTP/1.1\r\nHost: x\r\nX-Key: q\r\n\r\n"
    first = socket.create_connection(("127.0.0.1", d.port), timeout=5)
    first.sendall(request)
    assert b" 200 " in read_reply(first)
    earlier = []
    for _ in range(3):                  # turns at 10, 20 and 30 s: held
        s = socket.create_connection(("127.0.0.1", d.port), timeout=5)
        s.sendall(request)
        earlier.append(s)
    assert held(d, 3)
    redis_server.client().execute_command("CLIENT", "PAUSE", 600, "ALL")
    later = []
    for _ in range(3):                  # turns at 40, 50 and 60 s: with Redis
        s = socket.create_connection(("127.0.0.1", d.port), timeout=5)
        s.sendall(request)
        later.append(s)
    assert held(d, 6)
    t0 = terminate(d)
    answered = []
    for s in later + earlier:
        head = read_reply(s)
        answered.append((head.split(b" ")[1], round(time.monotonic() - t0, 2)))
        s.close()
    assert wait_exit(d, 5) == 0, d.log()
    assert [a[0] for a in answered] == [b"200"] * 6, answered
    # the later ones no sooner than drain_timeout, like the earlier ones
    assert min(a[1] for a in answered) >= 1.8, answered
