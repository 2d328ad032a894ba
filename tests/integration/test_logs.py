"""Logging (the contract's `log:` section, SPEC §8, STYLE 19): JSON lines,
one access line per check, untrusted bytes escaped, and levels.

    log: { level: info, format: text, access: false }

Access lines in the text format carry `route=NAME` and `status=CODE`."""
import json
import re
import signal
import socket
import time

from conftest import wait_until
from helpers import read_until_close
from ops_helpers import (check, fw, ops_daemon, policy, route, scrape, terminate,  # noqa: F401
                         vcheck, wait_exit)

ROUTES = route("api", "/api/", fw(2))


def log_policy(log, routes=ROUTES):
    return policy(routes, top="log: %s\n" % log)


def log_bytes(d):
    with open(d.log_path, "rb") as f:
        return f.read()


def access_lines(d):
    return [l for l in d.log().splitlines() if "status=" in l and "route=" in l]


def reload_errors(d):
    return scrape(d).get("ratelimitd_config_reloads_total", result="error")


def raw_check(port, path, headers=b""):
    """One check over a raw socket (for header bytes clients refuse to send)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=3)
    try:
        s.sendall(b"GET " + path + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" +
                  headers + b"\r\n")
        return int(read_until_close(s).split(b" ", 2)[1])
    finally:
        s.close()


def json_lines(d):
    out = []
    for raw in log_bytes(d).split(b"\n"):
        if not raw:
            continue
        try:
            o = json.loads(raw)     # also requires valid UTF-8
        except ValueError as e:
            raise AssertionError("log line is not JSON (%s): %r" % (e, raw))
        assert isinstance(o, dict), raw
        for k in ("ts", "level"):
            assert isinstance(o.get(k), str) and o[k], (k, raw)
        if o["level"] == "access":      # structured: route, key, status, ...
            assert isinstance(o.get("status"), int) and "route" in o, raw
        else:
            assert isinstance(o.get("msg"), str) and o["msg"], raw
        out.append(o)
    return out


def test_json_log_every_line_parses(ops_daemon):
    """format json: every stderr line is a JSON object with ts and level,
    and msg (access lines: route, status, ...), across startup, access lines
    (with hostile keys), a good and a bad reload and the drain."""
    d = ops_daemon(log_policy("{format: json, access: true}"))
    check(d, "/check/api/x", headers={"X-Key": "plain"})
    raw_check(d.port, b"/check/api/x",
              b"X-Key: a\x01b\"c\\d\x7f\xff\xc3\xa9\ttab\r\n")
    check(d, "/check/api/x?x=1", headers={"X-Key": 'quote"and\\back'})
    check(d, "/check/api/x?x=1", headers={"X-Key": "plain"})
    check(d, "/check/api/x?x=1", headers={"X-Key": "plain"})
    check(d, "/check/elsewhere")
    d.signal(signal.SIGHUP)                     # a good reload
    time.sleep(0.2)
    d.write_policy(log_policy("{format: json, access: true}") + "  bogus: 1\n")
    assert wait_until(lambda: reload_errors(d) >= 1, timeout=2), d.log()
    time.sleep(0.1)
    terminate(d)
    assert wait_exit(d, 7) == 0
    lines = json_lines(d)
    levels = {o["level"] for o in lines}
    assert levels & {"warn", "warning", "error"}, levels   # the refused reload
    assert "info" in levels, levels
    access = [o for o in lines if o["level"] == "access"]
    assert [o["status"] for o in access] == [200, 200, 200, 200, 429, 200], access
    assert [o["route"] for o in access][:5] == ["api"] * 5, access


def test_json_log_error_with_non_ascii_is_json(ops_daemon):
    """A refused reload whose error quotes a non-ASCII key ("limité"): the
    warning is still a valid JSON line (UTF-8 or \\u escapes, never \\xNN)."""
    d = ops_daemon(log_policy("{format: json}"))
    bad = log_policy("{format: json}").replace("server:\n", "server:\n  limité: 1\n", 1)
    d.write_policy(bad)
    assert wait_until(lambda: reload_errors(d) >= 1, timeout=2), d.log()
    time.sleep(0.1)
    lines = json_lines(d)
    assert any("limit" in o.get("msg", "") and o["level"] != "info" for o in lines), lines


def test_access_line_per_check(ops_daemon):
    d = ops_daemon(log_policy("{access: true}"))
    plan = [("/check/api/x", "api", 200), ("/check/api/x", "api", 200),
            ("/check/api/x", "api", 429), ("/check/other", None, 200)]
    for path, _, status in plan:
        assert check(d, path, headers={"X-Key": "k"}).status_code == status
    assert vcheck(d, {"route": "api", "key": "k"}).status_code == 429
    assert wait_until(lambda: len(access_lines(d)) >= len(plan) + 1, timeout=2), d.log()
    time.sleep(0.1)
    lines = access_lines(d)
    assert len(lines) == len(plan) + 1, lines
    for line, (_, name, status) in zip(lines, plan + [(None, "api", 429)]):
        assert "status=%d" % status in line, line
        if name:
            assert "route=%s" % name in line, line
    # the ops endpoints are not checks
    for p in ("/healthz", "/readyz", "/metrics", "/v1/policy"):
        check(d, p)
    time.sleep(0.1)
    assert len(access_lines(d)) == len(plan) + 1


def test_no_access_lines_by_default(ops_daemon):
    d = ops_daemon(policy(ROUTES))
    for _ in range(3):
        check(d, "/check/api/x", headers={"X-Key": "k"})
    time.sleep(0.1)
    assert access_lines(d) == [], d.log()


def test_hostile_keys_escaped_in_access_log(ops_daemon):
    """Control bytes, quotes and newlines in a client key (header or query)
    reach the access log escaped: no raw control byte, no forged line, one
    line per check."""
    d = ops_daemon(log_policy("{access: true}", routes=(
        ROUTES + route("q", "/q/", fw(5), key="query:k"))))
    forged = "2026-01-01T00:00:00.000Z info forged"
    assert raw_check(d.port, b"/check/api/x",
                     b"X-Key: a\x01b\x1b[31mred\x7f\"quote\\ \xff\r\n") == 200
    assert raw_check(d.port, b"/check/q/x?k=evil%0A" + forged.replace(" ", "%20").encode()
                     + b"%0D%00%22end") == 200
    assert raw_check(d.port, b"/check/q/x?k=%22%20status=999%20route=fake") == 200
    assert wait_until(lambda: len(access_lines(d)) >= 3, timeout=2), d.log()
    time.sleep(0.1)
    data = log_bytes(d)
    ctl = sorted({b for b in data if (b < 0x20 and b != 0x0A) or b == 0x7F})
    assert not ctl, "raw control bytes %r in the log:\n%r" % (ctl, data)
    text = data.decode("utf-8", "replace")
    assert not any(l.startswith(forged) for l in text.splitlines()), text
    lines = access_lines(d)
    assert len(lines) == 3, lines
    assert all("status=200" in l for l in lines), lines
    assert "status=999" not in text
    assert len(re.findall(r"route=fake", text)) <= 1      # only inside the quoted key
    assert not any(re.search(r'\broute=fake\b', l.split('key="', 1)[0]) for l in lines)


def test_json_access_line_says_no_route_as_null(ops_daemon):
    """It said "route":"-", the text format's placeholder, where /v1/check
    says null (an audit)."""
    d = ops_daemon(log_policy("{format: json, access: true}"))
    assert check(d, "/check/elsewhere").status_code == 200
    assert wait_until(lambda: '"result":"no_route"' in d.log(), timeout=3), d.log()
    line = json.loads([l for l in d.log().splitlines() if '"no_route"' in l][0])
    assert line["route"] is None and line["status"] == 200, line


def test_json_access_line_has_the_whole_key(ops_daemon):
    """A 256-byte key of quotes is 768 bytes percent-encoded, as in its
    Redis key: the JSON access line cut it at 511, inside an escape."""
    d = ops_daemon(log_policy("{access: true, format: json}"))
    assert vcheck(d, {"route": "api", "key": '"' * 256}).status_code == 200
    assert wait_until(lambda: any(o.get("level") == "access" for o in json_lines(d)),
                      timeout=2), d.log()
    (line,) = [o for o in json_lines(d) if o.get("level") == "access"]
    assert line["key"] == "%22" * 256, line


def test_level_warn_hides_info(ops_daemon):
    """level warn: the startup info line is not written, warnings are. A
    reload from info to warn applies to the lines after it."""
    d = ops_daemon(log_policy("{level: warn, format: json}"))
    d.signal(signal.SIGHUP)                       # a reload is info-worthy
    time.sleep(0.3)
    d.write_policy(log_policy("{level: warn, format: json}") + "  bogus: 1\n")
    assert wait_until(lambda: json_lines(d), timeout=2), "no warning for a refused reload"
    time.sleep(0.2)
    lines = json_lines(d)
    assert all(o["level"] not in ("info", "debug") for o in lines), lines
    assert any(o["level"] in ("warn", "warning", "error") for o in lines), lines


def test_level_warn_shows_redis_coming_back(ops_daemon, redis_server):
    """An outage is said at warn, and so is its end: at info, the end was
    filtered out of a log kept at warn, which read as a Redis that never
    came back."""
    d = ops_daemon(log_policy("{level: warn, format: json}"))
    assert redis_server.client().client_kill_filter(_type="normal") >= 1
    assert wait_until(lambda: any(": connected" in o["msg"] for o in json_lines(d)
                                  if o["level"] != "access"), timeout=5), json_lines(d)
    msgs = [(o["level"], o["msg"]) for o in json_lines(d)]
    down = [i for i, (_, m) in enumerate(msgs) if "disconnected" in m]
    up = [i for i, (_, m) in enumerate(msgs) if ": connected" in m]
    assert down and up and down[0] < up[0], msgs
    assert msgs[up[0]][0] == "warn", msgs


def test_level_error_still_logs_a_refused_reload(ops_daemon):
    """SPEC 2: a refused file is logged with its line and column. Its lines
    were warnings, which log.level error hid: only the metric said."""
    d = ops_daemon(log_policy("{level: error}"))
    d.write_policy(log_policy("{level: error}").replace("limit: 2", "limit: -1"))
    d.signal(signal.SIGHUP)
    assert wait_until(lambda: "refused" in d.log(), timeout=2), d.log()
    time.sleep(0.1)
    lines = d.log().splitlines()
    assert any(re.search(r" error .*policy-\d+\.yaml:\d+:\d+: ", l) for l in lines), lines
    assert not any(" info " in l or " warn " in l for l in lines), lines


def test_level_info_shows_info_then_reload_to_warn(ops_daemon):
    d = ops_daemon(log_policy("{level: info, format: json}"))
    assert wait_until(lambda: any(o["level"] == "info" for o in json_lines(d)), timeout=2), \
        d.log()
    d.write_policy(log_policy("{level: warn, format: json}"))
    assert wait_until(lambda: scrape(d).get("ratelimitd_config_reloads_total",
                                            result="success") >= 1, timeout=2.5)
    time.sleep(0.1)
    n = len(json_lines(d))
    d.signal(signal.SIGHUP)
    time.sleep(0.3)
    d.signal(signal.SIGHUP)
    time.sleep(0.3)
    new = json_lines(d)[n:]
    assert all(o["level"] not in ("info", "debug") for o in new), new


def test_level_error_hides_warnings(ops_daemon):
    """level error: startup (info) and a reload that changes server.workers
    (a warning: it takes effect on restart) write nothing."""
    d = ops_daemon(log_policy("{level: error}"))
    d.write_policy(log_policy("{level: error}").replace("server:\n", "server:\n  workers: 2\n", 1))
    d.signal(signal.SIGHUP)
    assert wait_until(lambda: scrape(d).get("ratelimitd_config_reloads_total",
                                            result="success") >= 1, timeout=2)
    check(d, "/check/api/x", headers={"X-Key": "k"})
    time.sleep(0.1)
    assert d.log() == "", d.log()


def test_libevent_messages_take_the_log_format(tmp_path, redis_server):
    """Out of descriptors, libevent's own "[warn] ..." lines went to stderr
    as they were, between JSON lines."""
    import os
    import resource
    import subprocess

    from conftest import BIN, free_port
    path = os.path.join(str(tmp_path), "p.yaml")
    with open(path, "w") as f:
        f.write("log: {format: json}\nserver: {listen: 127.0.0.1:%d}\n"
                "redis: {address: 127.0.0.1:%d}\nroutes: []\n"
                % (free_port(), redis_server.port))
    p = subprocess.run([BIN, "-c", path], capture_output=True, timeout=10,
                       preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (11, 11)))
    lines = p.stderr.decode().splitlines()
    assert p.returncode == 1 and any("libevent: " in l for l in lines), lines
    for line in lines:
        json.loads(line)


def test_a_stalled_log_reader_never_stalls_checks(start_daemon, tmp_path):
    """stderr is a pipe (systemd, Docker, `| tee`) whose reader stops
    reading: once the pipe was full, the next line blocked the worker that
    wrote it, and every check and /healthz with it, until the reader went
    on. Lines now go through a queue a thread of its own writes out: a
    stalled reader costs lines (counted, and told once it reads again),
    never a check."""
    import os
    from conftest import BIN
    from helpers import policy as plain_policy
    fifo = str(tmp_path / "stderr.fifo")
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    wrapper = tmp_path / "to-fifo.sh"
    wrapper.write_text('#!/bin/sh\nexec %s "$@" 2>%s\n' % (BIN, fifo))
    wrapper.chmod(0o755)
    d = start_daemon(plain_policy(
        "  - name: api\n    match: {prefix: /}\n    key: header:X-Key\n"
        "    limits: [{name: q, algorithm: fixed_window, limit: 1000000, window: 1h}]\n",
        server="  workers: 1\n", top="log: {access: true}\n"), bin=str(wrapper))
    try:
        import requests
        s = requests.Session()
        # ~700 bytes an access line: the 64 KiB pipe is full after ~100
        # checks, the 1 MB queue after ~1,600 more.
        for i in range(2500):
            r = s.get(d.url("/check/x"), headers={"X-Key": "k%d-" % (i % 50) + "!" * 240},
                      timeout=5)
            assert r.status_code == 200 and r.headers["X-RateLimit-Remaining"] != "-1", (i, r)
        assert requests.get(d.url("/healthz"), timeout=5).text == "ok"
        dropped = scrape(d).get("ratelimitd_log_lines_dropped_total")
        assert dropped > 0
        # Read again: what was queued comes out in whole lines, then the
        # count of those dropped.
        got = b""

        def read_some():
            nonlocal got
            try:
                while True:
                    chunk = os.read(reader, 1 << 16)
                    if not chunk:
                        break
                    got += chunk
            except BlockingIOError:
                pass
            return b"log lines dropped: stderr was not read fast enough" in got
        assert wait_until(read_some, timeout=10), got[-500:]
        told = re.search(rb"warn (\d+) log lines dropped", got)
        assert told and int(told.group(1)) == dropped, (told, dropped)
        lines = got.split(b"\n")[:-1]
        assert all(re.match(rb"^\S+Z (info|warn|access) ", l) for l in lines), \
            [l for l in lines if not re.match(rb"^\S+Z (info|warn|access) ", l)][:3]
    finally:
        os.close(reader)


def refusal_lines(d):
    return [l for l in d.log().splitlines() if ": refused " in l]


def test_refused_requests_are_told_and_counted(ops_daemon):
    """A gateway that sends what the daemon refuses gets an error it turns
    into its own (nginx's auth_request: a 500), and nothing here said why:
    no line, no metric. Now the first refusal is told at once (what, from
    whom, the status and why), every one is counted by status, and a burst
    is told in at most a line a second with how many it stands for."""
    d = ops_daemon(policy(ROUTES))
    m = scrape(d)
    shown = {(n, l.get("status"), v) for n, l, v in m.samples}
    for status in (400, 404, 413, 431, 500, 501, 505):
        assert ("ratelimitd_http_errors_total", str(status), 0) in shown, status
    assert check(d, "/nope").status_code == 404
    assert wait_until(lambda: refusal_lines(d), timeout=2), d.log()
    (line,) = refusal_lines(d)
    assert "refused GET /nope from 127.0.0.1: 404 not found" in line, line
    # the rest of this second's refusals are held, then told by the timer
    assert vcheck(d, {"route": "api", "key": "k", "cost": "x"}).status_code == 400
    assert raw_check(d.port, b"/check/api/x", b"X-Big: " + b"a" * 17000 + b"\r\n") == 431
    assert wait_until(lambda: len(refusal_lines(d)) >= 2, timeout=3), d.log()
    time.sleep(0.2)
    lines = refusal_lines(d)
    assert len(lines) == 2, lines
    assert "refused a request from 127.0.0.1: 431 request head larger than 16 KiB (" in lines[1]
    assert "ms ago, and 1 more refused since the last such line)" in lines[1], lines[1]
    m = scrape(d)
    assert m.get("ratelimitd_http_errors_total", status="404") == 1
    assert m.get("ratelimitd_http_errors_total", status="400") == 1
    assert m.get("ratelimitd_http_errors_total", status="431") == 1
    # a flood: counted one by one, told in a line or two
    for _ in range(50):
        assert check(d, "/nope\x7f").status_code in (400, 404)
    time.sleep(1.2)
    flood = refusal_lines(d)[2:]
    assert 1 <= len(flood) <= 3, flood
    m = scrape(d)
    assert m.get("ratelimitd_http_errors_total", status="404") + \
        m.get("ratelimitd_http_errors_total", status="400") == 52
    # checks and their verdicts are not refusals
    for _ in range(3):
        check(d, "/check/api/x", headers={"X-Key": "k"})
    assert scrape(d).get("ratelimitd_http_errors_total", status="400") + \
        scrape(d).get("ratelimitd_http_errors_total", status="404") == 52


def test_refusals_not_told_at_level_warn(ops_daemon):
    d = ops_daemon(log_policy("{level: warn}"))
    assert check(d, "/nope").status_code == 404
    time.sleep(0.2)
    assert refusal_lines(d) == [], d.log()
    assert scrape(d).get("ratelimitd_http_errors_total", status="404") == 1


def test_refusal_line_escapes_the_target(ops_daemon):
    """The target is the client's: escaped as every untrusted byte in a
    line is, backslash and quote included, so a target that spells an
    escape out is told apart from the byte (an audit: "/a\\xff" and "/a"
    with a byte 0xFF made the same line)."""
    d = ops_daemon(log_policy("{format: json}"))
    assert raw_check(d.port, b"/nope\"\\%0A\xff") == 404
    assert wait_until(lambda: refusal_lines(d), timeout=2), d.log()
    lines = [o for o in json_lines(d) if "refused" in o.get("msg", "")]
    assert len(lines) == 1, lines
    assert lines[0]["level"] == "info"
    assert 'GET /nope\\"\\\\%0A\\xff from 127.0.0.1: 404 not found' in lines[0]["msg"], \
        lines[0]
    t = ops_daemon(policy(ROUTES))
    assert raw_check(t.port, b"/a\\xff") == 404
    time.sleep(1.1)                     # the next refusal's line is not held
    assert raw_check(t.port, b"/a\xff") == 404
    assert wait_until(lambda: len(refusal_lines(t)) >= 2, timeout=3), t.log()
    first, second = refusal_lines(t)[:2]
    assert "refused GET /a\\\\xff from" in first, first
    assert "refused GET /a\\xff from" in second, second


def test_refusal_after_the_head_names_the_request(ops_daemon):
    """A refusal once the head is read (a body too large, a bad
    Content-Length) names the request line; it said "a request"."""
    d = ops_daemon(policy(ROUTES))
    s = socket.create_connection(("127.0.0.1", d.port), timeout=3)
    try:
        s.sendall(b"POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n")
        assert read_until_close(s).split(b" ", 2)[1] == b"413"
    finally:
        s.close()
    assert wait_until(lambda: refusal_lines(d), timeout=2), d.log()
    (line,) = refusal_lines(d)
    assert "refused POST /v1/check from 127.0.0.1: 413 request body larger than 64 KiB" \
        in line, line
    assert scrape(d).get("ratelimitd_http_errors_total", status="413") == 1
