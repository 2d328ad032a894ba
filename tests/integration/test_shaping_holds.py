"""A leaky_bucket with `delay: true` holds an allowed reply until its turn.
A client that leaves during the hold (it closes, or half-closes, as nginx
takes it too) ends the hold at once: its socket, buffers and connection slot
are freed, not kept in CLOSE-WAIT until the turn comes. The admission stays
spent, and counted allowed; the access line says 499, nginx's status for a
client that closed first."""
import os
import socket
import struct
import time

from conftest import wait_until
from ops_helpers import ops_daemon, policy, route, scrape  # noqa: F401

# The first check passes at once; the k-th is held (k-1) * 10 s.
HOLD = '{algorithm: leaky_bucket, rate: "1/10s", burst: 50, delay: true}'


def held_policy(server="", timeout="50ms"):
    return policy(route("lb", "/lb/", HOLD) + route(
        "free", "/free/", "{algorithm: fixed_window, limit: 100, window: 1h}"),
        server=server, top="log:\n  access: true\n", timeout=timeout)


def send_check(port, path="/check/lb/x", key="k"):
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(("GET %s HTTP/1.1\r\nHost: t\r\nX-Key: %s\r\n\r\n" % (path, key)).encode())
    return s


def reply_status(s):
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(4096)
        if not chunk:
            break
        data += chunk
    return int(data.split(b" ")[1]) if data else None


def open_fds(pid):
    return len(os.listdir("/proc/%d/fd" % pid))


def in_flight(d):
    return scrape(d).get("ratelimitd_in_flight")


def test_closed_clients_end_their_holds(ops_daemon):
    d = ops_daemon(held_policy())
    first = send_check(d.port)
    assert reply_status(first) == 200          # the bucket's first: no wait
    first.close()
    socks = [send_check(d.port) for _ in range(10)]
    assert wait_until(lambda: in_flight(d) == 10, timeout=3), in_flight(d)
    holding = open_fds(d.proc.pid)
    t0 = time.monotonic()
    for s in socks:
        s.close()
    assert wait_until(lambda: in_flight(d) == 0, timeout=2), in_flight(d)
    assert wait_until(lambda: open_fds(d.proc.pid) <= holding - 10, timeout=2), (
        open_fds(d.proc.pid), holding)
    assert time.monotonic() - t0 < 2          # the shortest hold was 10 s
    m = scrape(d)
    assert m.checks("lb", "allowed") == 11     # admitted: the slot is spent
    # (access lines go out in batches, within 10 ms)
    lb = lambda: [l for l in d.log().splitlines() if "route=lb" in l]  # noqa: E731
    assert wait_until(lambda: len(lb()) == 11, timeout=1), lb()
    held = lb()
    assert sum("status=499" in l for l in held) == 10, held
    assert sum("status=200" in l for l in held) == 1, held
    # Nothing was given back: the next check waits behind the 11 (110 s).
    s = send_check(d.port)
    assert wait_until(lambda: in_flight(d) == 1, timeout=3)
    s.settimeout(0.5)
    try:
        got = s.recv(4096)
    except socket.timeout:
        got = None
    assert got is None, got
    s.close()


def test_half_closed_client_ends_its_hold_and_gets_no_early_reply(ops_daemon):
    """Half-closing must not pass a client ahead of its turn: the hold ends
    with no reply, the socket is closed."""
    d = ops_daemon(held_policy())
    first = send_check(d.port)
    assert reply_status(first) == 200
    first.close()
    s = send_check(d.port)
    assert wait_until(lambda: in_flight(d) == 1, timeout=3)
    s.shutdown(socket.SHUT_WR)
    t0 = time.monotonic()
    s.settimeout(5)
    assert s.recv(4096) == b""                 # closed, no 200 before its turn
    assert time.monotonic() - t0 < 2
    assert wait_until(lambda: in_flight(d) == 0, timeout=2)
    s.close()


def test_client_gone_before_its_verdict_is_not_held(ops_daemon, redis_server):
    """A client that leaves while its check is still with Redis: when the
    verdict comes, its hold never starts (499), rather than keeping a
    CLOSE-WAIT socket until its turn."""
    d = ops_daemon(held_policy(timeout="2s"))
    first = send_check(d.port)
    assert reply_status(first) == 200
    first.close()
    redis_server.client().execute_command("CLIENT", "PAUSE", 500, "ALL")
    s = send_check(d.port)
    assert wait_until(lambda: in_flight(d) == 1, timeout=3)
    s.close()                                   # before the verdict (0.5 s)
    lb = lambda: [l for l in d.log().splitlines() if "route=lb" in l]  # noqa: E731
    assert wait_until(lambda: len(lb()) == 2, timeout=3), d.log()
    assert "status=499" in lb()[1], lb()
    assert in_flight(d) == 0
    assert wait_until(lambda: close_wait(d.port) == 0, timeout=1), close_wait(d.port)


def close_wait(port):
    return len(tcp_rows(port, "08"))


def test_client_that_stays_still_gets_its_turn(ops_daemon):
    """Another client's leaving does not move anybody's turn."""
    d = ops_daemon(policy(route("lb", "/lb/",
                                '{algorithm: leaky_bucket, rate: "2/s", burst: 5, delay: true}')))
    first = send_check(d.port)
    assert reply_status(first) == 200
    t0 = time.monotonic()
    leaving = send_check(d.port)               # turn at 0.5 s
    staying = send_check(d.port)               # turn at 1.0 s
    assert wait_until(lambda: in_flight(d) == 2, timeout=3)
    leaving.close()
    assert reply_status(staying) == 200
    assert 0.8 <= time.monotonic() - t0 <= 1.6
    staying.close()
    first.close()


def test_held_connections_free_their_slots(ops_daemon):
    """At max_connections, held checks whose clients left no longer keep a
    new client out for the length of their hold."""
    d = ops_daemon(held_policy(server="  max_connections: 4\n"))
    first = send_check(d.port)
    assert reply_status(first) == 200
    first.close()
    socks = [send_check(d.port) for _ in range(4)]
    # At the cap a scrape would wait too: count the daemon's sockets.
    assert wait_until(lambda: established(d.port) == 4, timeout=3), established(d.port)
    time.sleep(0.2)                            # let all four reach their hold
    for s in socks:
        s.close()
    t0 = time.monotonic()
    s = send_check(d.port, "/check/free/x")
    s.settimeout(5)
    assert reply_status(s) == 200
    assert time.monotonic() - t0 < 2           # the holds were 10 s and more
    s.close()


def tcp_rows(port, state):
    """/proc/net/tcp's rows (split) for the daemon's end of its IPv4
    connections on `port` in `state` ("01" established, "08" CLOSE-WAIT)."""
    rows = [r.split() for r in open("/proc/net/tcp").read().splitlines()[1:]]
    return [f for f in rows if f[1].endswith(":%04X" % port) and f[3] == state]


def established(port):
    return len(tcp_rows(port, "01"))


def test_client_leaving_behind_a_full_buffer_ends_its_hold(ops_daemon):
    """Pipelined bytes behind a held request fill the input buffer, so the
    read event is paused: leaving must still end the hold."""
    d = ops_daemon(held_policy())
    first = send_check(d.port)
    assert reply_status(first) == 200
    first.close()
    for how in ("fin", "rst"):
        s = send_check(d.port)
        assert wait_until(lambda: in_flight(d) == 1, timeout=3)
        pad = b"GET /check/free/x HTTP/1.1\r\nHost: t\r\nX-Key: k\r\n\r\n" * 2000
        s.setblocking(False)
        sent, t0 = 0, time.monotonic()
        while sent < len(pad) and time.monotonic() - t0 < 2:
            try:
                sent += s.send(pad[sent:])
            except BlockingIOError:
                time.sleep(0.01)
        time.sleep(0.2)
        if how == "rst":
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()
        assert wait_until(lambda: in_flight(d) == 0, timeout=2), (how, in_flight(d))


def test_reset_with_replies_unsent_ends_its_hold(ops_daemon):
    """Earlier replies wait unsent (the client stopped reading), a held one
    is pending, then the client resets: the failed write must end the hold
    as the read event would have."""
    d = ops_daemon(policy(route("lb", "/lb/", HOLD) + route(
        "free", "/free/", "{algorithm: fixed_window, limit: 100000000, window: 1h}")))
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", d.port))
    one = b"GET /check/free/x HTTP/1.1\r\nHost: t\r\nX-Key: k\r\n\r\n"
    sent, last, still = 0, None, 0
    # Until the kernel's queue stops growing: then the replies of the last
    # rounds wait in the daemon's own buffer, armed for writing. Small
    # rounds, so that buffer stays under the backlog that pauses reading
    # (the held request must still be read).
    while still < 2 and sent < 200000:
        s.sendall(one * 50)
        sent += 50
        assert wait_until(lambda: scrape(d).sum("ratelimitd_checks_total",
                                                route="free") == sent, timeout=2), sent
        q = send_queue(d.port)
        still, last = (still + 1 if q == last else 0), q
    # The queue's first passes at once (the loop may take longer than a
    # turn): then the pipelined one is held.
    first = send_check(d.port)
    assert reply_status(first) == 200
    first.close()
    s.sendall(b"GET /check/lb/x HTTP/1.1\r\nHost: t\r\nX-Key: k\r\n\r\n")
    ok = wait_until(lambda: in_flight(d) == 1, timeout=3)
    assert ok, d.log()[-2000:]
    time.sleep(0.2)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()
    assert wait_until(lambda: in_flight(d) == 0, timeout=2), in_flight(d)


def send_queue(port):
    """Bytes the kernel holds unsent on the daemon's connection on `port`."""
    rows = tcp_rows(port, "01")
    return int(rows[0][4].split(":")[0], 16) if rows else None


def test_a_shadow_route_holds_no_reply(ops_daemon):
    """A shadow route reports what enforcement would do and always answers
    200; a hold is enforcement, and held replies on a shadow route timed
    out a gateway's checks (an audit). Its checks are answered at once,
    charged and reported as if held (leaky_bucket's queue fills alike)."""
    d = ops_daemon(policy(route("watch", "/w/", HOLD, extra="    shadow: true\n")))
    took, remaining = [], []
    for _ in range(4):
        s = send_check(d.port, "/check/w/x")
        t0 = time.monotonic()
        data = b""
        while b"\r\n\r\n" not in data:
            data += s.recv(4096)
        took.append(time.monotonic() - t0)
        s.close()
        assert data.startswith(b"HTTP/1.1 200 "), data
        remaining.append(int(data.split(b"X-RateLimit-Remaining: ")[1].split(b"\r\n")[0]))
    assert max(took) < 1.0, took       # the 4th would be held 30 s
    assert remaining == [49, 48, 47, 46], remaining
