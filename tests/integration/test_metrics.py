"""Metrics and the operations endpoints (SPEC §3.3, §7, §8): /metrics in the
Prometheus text format with exact check counts per route and result, Redis
failure counters and gauges, the duration histogram; /readyz; /v1/policy
without secrets, and the Redis password nowhere in the logs."""
import os
import signal
import subprocess
import threading
import time

import requests

from conftest import RedisServer, wait_until
from ops_helpers import (Metrics, check, family_of, fw, get_policy, ops_daemon,  # noqa: F401
                         policy, route, scrape, vcheck)

REQUIRED = {
    "ratelimitd_checks_total": "counter",
    "ratelimitd_check_duration_seconds": "histogram",
    "ratelimitd_redis_errors_total": "counter",
    "ratelimitd_redis_connected": "gauge",
    "ratelimitd_config_reloads_total": "counter",
    "ratelimitd_config_last_reload_successful": "gauge",
    "ratelimitd_route_info": "gauge",
    "ratelimitd_in_flight": "gauge",
    "ratelimitd_limit_denials_total": "counter",
}

TWO_ROUTES = policy(
    route("lim", "/api/", fw(3)) +
    route("shadowed", "/shadow/", fw(2), extra="    shadow: true\n"))


def histogram(m, name="ratelimitd_check_duration_seconds"):
    """[(le, cumulative count)] in exposition order, plus _count and _sum."""
    buckets = [(float(l["le"]), v) for n, l, v in m.samples if n == name + "_bucket"]
    return buckets, m.get(name + "_count"), m.get(name + "_sum")


def test_metrics_exposition_format(ops_daemon):
    d = ops_daemon(TWO_ROUTES)
    check(d, "/check/api/x", headers={"X-Key": "k"})
    r = requests.get(d.url("/metrics"), timeout=2)
    assert r.status_code == 200
    assert r.headers["Content-Type"].startswith("text/plain")
    m = Metrics(r.text)
    assert r.text.endswith("\n")
    for family, typ in REQUIRED.items():
        assert m.types.get(family) == typ, (family, m.types)
    for name, labels, _ in m.samples:
        assert family_of(name, m.types), "sample without a TYPE: " + name
    assert m.has("ratelimitd_in_flight")
    assert m.get("ratelimitd_in_flight") == 0
    assert m.get("ratelimitd_redis_connected") == 1
    for kind in ("timeout", "disconnected", "error", "noscript"):
        assert m.get("ratelimitd_redis_errors_total", kind=kind) == 0, kind
    # every checks_total sample carries exactly the labels route and result
    for name, labels, _ in m.samples:
        if name == "ratelimitd_checks_total":
            assert set(labels) == {"route", "result"}, labels


def test_checks_total_exact(ops_daemon):
    """N allowed, M denied, K with no route: the counters say exactly that,
    and the histogram counted every check, cumulatively."""
    d = ops_daemon(TWO_ROUTES)
    before = scrape(d)
    n_allowed, n_denied, n_none = 3, 4, 5
    got = [check(d, "/check/api/x", headers={"X-Key": "k"}).status_code
           for _ in range(n_allowed + n_denied)]
    assert got == [200] * n_allowed + [429] * n_denied
    for i in range(n_none):
        r = check(d, "/check/elsewhere/%d" % i, headers={"X-Key": "k"})
        assert r.status_code == 200 and "X-RateLimit-Limit" not in r.headers
    m = scrape(d)
    assert m.checks("lim", "allowed") == n_allowed
    assert m.checks("lim", "denied") == n_denied
    for result in ("shadow_denied", "failed_open", "failed_closed", "no_route"):
        assert m.checks("lim", result) == 0, result
    assert m.sum("ratelimitd_checks_total", result="no_route") - \
        before.sum("ratelimitd_checks_total", result="no_route") == n_none
    total = n_allowed + n_denied + n_none
    assert m.sum("ratelimitd_checks_total") - before.sum("ratelimitd_checks_total") == total

    buckets, count, total_s = histogram(m)
    assert count == total
    assert buckets, "no histogram buckets"
    les = [le for le, _ in buckets]
    assert les == sorted(les) and les[-1] == float("inf")
    values = [v for _, v in buckets]
    assert all(a <= b for a, b in zip(values, values[1:])), "buckets not cumulative"
    assert values[-1] == count
    assert 0 < total_s < count * 1.0


def test_json_checks_are_counted(ops_daemon):
    d = ops_daemon(TWO_ROUTES)
    for _ in range(4):
        vcheck(d, {"route": "lim", "key": "j"})
    assert vcheck(d, {"method": "GET", "path": "/nowhere"}).json()["route"] is None
    m = scrape(d)
    assert m.checks("lim", "allowed") == 3
    assert m.checks("lim", "denied") == 1
    assert m.get("ratelimitd_check_duration_seconds_count") == 5


def test_shadow_denied_counted(ops_daemon):
    d = ops_daemon(TWO_ROUTES)
    got = [check(d, "/check/shadow/x", headers={"X-Key": "s"}).status_code for _ in range(5)]
    assert got == [200] * 5
    m = scrape(d)
    assert m.checks("shadowed", "allowed") == 2
    assert m.checks("shadowed", "shadow_denied") == 3
    assert m.checks("shadowed", "denied") == 0


def test_redis_killed_fails_open_and_counts(ops_daemon, redis_server):
    d = ops_daemon(TWO_ROUTES)
    assert check(d, "/check/api/x", headers={"X-Key": "k"}).status_code == 200
    redis_server.kill()
    assert wait_until(lambda: scrape(d).get("ratelimitd_redis_connected") == 0, timeout=3), \
        scrape(d).text
    for _ in range(3):
        r = check(d, "/check/api/x", headers={"X-Key": "k"})
        assert r.status_code == 200
        assert r.headers.get("X-RateLimit-Remaining") == "-1"
    m = scrape(d)
    assert m.checks("lim", "failed_open") == 3
    assert m.checks("lim", "allowed") == 1
    assert m.sum("ratelimitd_redis_errors_total") > 0, m.text
    kinds = {l["kind"] for n, l, v in m.samples if n == "ratelimitd_redis_errors_total"}
    assert kinds <= {"timeout", "disconnected", "error", "noscript"}, kinds
    assert m.get("ratelimitd_redis_connected") == 0
    r = requests.get(d.url("/readyz"), timeout=2)
    assert r.status_code == 503
    body = r.json()
    assert body["ready"] is False and body["policy"] is True
    assert body["redis"] in ("connecting", "down")


def test_redis_killed_fail_closed_counts(ops_daemon, redis_server):
    d = ops_daemon(policy(route("lim", "/api/", fw(3)), top="failure_mode: closed\n"))
    redis_server.kill()
    assert wait_until(lambda: scrape(d).get("ratelimitd_redis_connected") == 0, timeout=3)
    for _ in range(4):
        assert check(d, "/check/api/x", headers={"X-Key": "k"}).status_code == 503
    m = scrape(d)
    assert m.checks("lim", "failed_closed") == 4
    assert m.checks("lim", "failed_open") == 0
    assert m.sum("ratelimitd_redis_errors_total") > 0


def test_redis_timeout_counted(ops_daemon, redis_server):
    """A paused Redis: the check answers at its deadline (fail-open) and the
    error is counted with kind="timeout"."""
    d = ops_daemon(TWO_ROUTES)
    assert check(d, "/check/api/x", headers={"X-Key": "k"}).status_code == 200
    redis_server.pause()
    try:
        r = check(d, "/check/api/x", headers={"X-Key": "k"})
        assert r.status_code == 200 and r.headers.get("X-RateLimit-Remaining") == "-1"
        m = scrape(d)
        assert m.get("ratelimitd_redis_errors_total", kind="timeout") >= 1, m.text
        assert m.checks("lim", "failed_open") == 1
    finally:
        redis_server.resume()
    # the late reply is dropped: nothing stays in flight
    assert wait_until(lambda: scrape(d).get("ratelimitd_in_flight") == 0, timeout=2)
    assert wait_until(lambda: check(d, "/check/api/x", headers={"X-Key": "k"})
                      .headers.get("X-RateLimit-Remaining") != "-1", timeout=3)


def test_each_failed_check_counted_once(ops_daemon, redis_server):
    """A check answered at its deadline counts one `timeout`; when the link
    is later dropped because the paused Redis never answers, those calls
    fail again inside the store, but their checks were answered already and
    must not be counted a second time as `disconnected`."""
    d = ops_daemon(TWO_ROUTES)
    assert check(d, "/check/api/x", headers={"X-Key": "k"}).status_code == 200
    redis_server.pause()
    try:
        for key in ("a", "b"):
            r = check(d, "/check/api/x", headers={"X-Key": key})
            assert r.headers.get("X-RateLimit-Remaining") == "-1"
        # no reply for 1 s with calls pending: the link is dropped
        assert wait_until(lambda: "dropping the link" in d.log(), timeout=5), d.log()
        assert wait_until(lambda: scrape(d).get("ratelimitd_redis_connected") == 0, timeout=3)
        m = scrape(d)
        assert m.checks("lim", "failed_open") == 2
        assert m.get("ratelimitd_redis_errors_total", kind="timeout") == 2, m.text
        assert m.get("ratelimitd_redis_errors_total", kind="disconnected") == 0, m.text
        assert m.get("ratelimitd_redis_errors_total", kind="error") == 0, m.text
    finally:
        redis_server.resume()
    assert wait_until(lambda: scrape(d).get("ratelimitd_redis_connected") == 1, timeout=5)
    assert scrape(d).sum("ratelimitd_redis_errors_total") == 2


def test_routes_in_force_show_their_results_from_zero(ops_daemon):
    """A (route, result) series appeared only at its first event, already
    at its value, so Prometheus's rate() and increase() never saw that
    first burst: a short Redis outage on a route that had never failed was
    invisible (Prometheus's advice: initialise the label sets you know).
    Each route in force shows the results it can have from 0; a reload
    shows the new set, and what was counted stays."""
    def results(m):
        got = {}
        for n, l, v in m.samples:
            if n == "ratelimitd_checks_total":
                got.setdefault(l["route"], {})[l["result"]] = v
        return got
    d = ops_daemon(policy(route("api", "/api/", fw(2)) +
                          route("sh", "/sh/", fw(2), extra="    shadow: true\n") +
                          route("cl", "/cl/", fw(2), extra="    failure_mode: closed\n")))
    assert results(scrape(d)) == {
        "": {"no_route": 0},
        "api": {"allowed": 0, "denied": 0, "failed_open": 0},
        "sh": {"allowed": 0, "shadow_denied": 0, "failed_open": 0},
        "cl": {"allowed": 0, "denied": 0, "failed_closed": 0}}
    assert check(d, "/check/api/x", headers={"X-Key": "k"}).status_code == 200
    d.write_policy(policy(route("api", "/api/", fw(2), extra="    shadow: true\n") +
                          route("new", "/new/", fw(2))))
    d.signal(signal.SIGHUP)
    assert wait_until(lambda: "loaded, 2 routes" in d.log(), timeout=5)
    assert results(scrape(d)) == {
        "": {"no_route": 0},
        "api": {"allowed": 1, "shadow_denied": 0, "failed_open": 0},
        "new": {"allowed": 0, "denied": 0, "failed_open": 0}}


def test_route_names_past_the_label_table_count_as_other(ops_daemon):
    """Route names add up over reloads, and the label table that bounds a
    scrape holds 1022 of them. Routes named after that are counted under
    route="(other)" (a label no route can have), said once in the log; never
    under "", which means no route matched."""
    def routes(prefix):
        return "".join(route("%s%d" % (prefix, i), "/%s%d/" % (prefix, i), fw(5))
                       for i in range(1000))
    d = ops_daemon(policy(routes("a")))
    assert check(d, "/check/a7/x", headers={"X-Key": "k"}).status_code == 200
    d.write_policy(policy(routes("b")))
    d.signal(signal.SIGHUP)
    assert wait_until(lambda: "loaded, 1000 routes" in d.log().split("SIGHUP", 1)[-1], timeout=5)
    assert check(d, "/check/b0/x", headers={"X-Key": "k"}).status_code == 200
    assert check(d, "/check/b999/x", headers={"X-Key": "k"}).status_code == 200
    m = scrape(d)
    assert m.checks("a7", "allowed") == 1
    assert m.checks("b0", "allowed") == 1           # name 1001 of 1022
    assert m.checks("(other)", "allowed") == 1      # name 2000
    assert m.checks("", "allowed") == 0
    assert d.log().count('counted as route="(other)"') == 1, d.log()
    # the routes in force show from 0 (b0..b21 have names of their own,
    # the rest are "(other)"); a route no longer in force only if counted
    series = {l["route"] for n, l, v in m.samples if n == "ratelimitd_checks_total"}
    assert series == {"", "(other)", "a7"} | {"b%d" % i for i in range(22)}, series


def test_in_flight_gauge_counts_held_checks(ops_daemon):
    """leaky_bucket with delay holds allowed replies: while they wait,
    ratelimitd_in_flight counts them; afterwards it is back to 0."""
    d = ops_daemon(policy(route(
        "lb", "/lb/", '{algorithm: leaky_bucket, rate: "4/s", burst: 4, delay: true}')))
    out = []

    def one():
        out.append(check(d, "/check/lb/x", headers={"X-Key": "h"}).status_code)
    ts = [threading.Thread(target=one) for _ in range(4)]
    for t in ts:
        t.start()
    assert wait_until(lambda: scrape(d).get("ratelimitd_in_flight") >= 2, timeout=2)
    for t in ts:
        t.join(5)
    assert out == [200] * 4
    m = scrape(d)
    assert m.get("ratelimitd_in_flight") == 0
    # the histogram times the whole check, shaping delay included: the
    # replies held 0.5 s and 0.75 s are above the 0.25 s bucket
    buckets, count, total_s = histogram(m)
    assert count == 4
    low = [v for le, v in buckets if le <= 0.25]
    assert not low or low[-1] <= 2, buckets
    assert total_s >= 1.0, total_s


def test_readyz_json(ops_daemon):
    d = ops_daemon(TWO_ROUTES)
    r = requests.get(d.url("/readyz"), timeout=2)
    assert r.status_code == 200
    assert r.headers["Content-Type"].startswith("application/json")
    assert r.json() == {"ready": True, "policy": True, "redis": "up"}


def test_readyz_before_redis_exists(ops_daemon, tmp_path):
    """Redis not there yet: 503 with redis not up; it comes up: 200."""
    from conftest import free_port
    port = free_port()
    d = ops_daemon(TWO_ROUTES, redis_port=port, wait_ready=False)
    r = requests.get(d.url("/readyz"), timeout=2)
    assert r.status_code == 503
    assert r.json()["ready"] is False and r.json()["redis"] in ("connecting", "down")
    server = RedisServer(tmp_path / "late", port=port)
    os.makedirs(server.dir, exist_ok=True)
    server.start()
    try:
        assert wait_until(lambda: requests.get(d.url("/readyz"), timeout=1).status_code == 200,
                          timeout=5)
        assert requests.get(d.url("/readyz"), timeout=2).json() == \
            {"ready": True, "policy": True, "redis": "up"}
    finally:
        server.stop()


def test_policy_endpoint_shows_routes(ops_daemon):
    d = ops_daemon(TWO_ROUTES)
    p = get_policy(d)
    names = [r["name"] for r in p["routes"]]
    assert names == ["lim", "shadowed"]
    lim = p["routes"][0]
    assert lim["limits"][0]["name"] == "q"
    assert lim["limits"][0]["algorithm"] == "fixed_window"
    assert lim["limits"][0]["limit"] == 3
    assert p["routes"][1]["shadow"] is True


PASSWORD = "s3cr3t-Pw-7f2a91"


def start_password_redis(tmp_path, password):
    from conftest import free_port
    port = free_port()
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", str(tmp_path), "--requirepass", password],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    import redis
    assert wait_until(lambda: redis.Redis(port=port, password=password).ping())
    return port, proc


def test_password_never_shown(ops_daemon, tmp_path):
    """Redis with --requirepass, the daemon with REDIS_PASSWORD: it connects
    (the password is used), and the password string is in neither
    /v1/policy, /metrics, /readyz nor the log. A wrong password (AUTH fails,
    not ready) is not logged either."""
    port, proc = start_password_redis(tmp_path, PASSWORD)
    try:
        d = ops_daemon(TWO_ROUTES, redis_port=port, env={"REDIS_PASSWORD": PASSWORD})
        assert check(d, "/check/api/x", headers={"X-Key": "k"}).headers.get(
            "X-RateLimit-Remaining") == "2"
        for path in ("/v1/policy", "/metrics", "/readyz", "/healthz"):
            assert PASSWORD not in requests.get(d.url(path), timeout=2).text, path
        d.signal(signal.SIGHUP)
        time.sleep(0.3)
        assert PASSWORD not in requests.get(d.url("/v1/policy"), timeout=2).text

        wrong = "wr0ng-Pw-55e1c0"
        d2 = ops_daemon(TWO_ROUTES, redis_port=port, env={"REDIS_PASSWORD": wrong},
                        wait_ready=False)
        time.sleep(0.8)
        r = requests.get(d2.url("/readyz"), timeout=2)
        assert r.status_code == 503
        r = check(d2, "/check/api/x", headers={"X-Key": "k"})
        assert r.status_code == 200 and r.headers.get("X-RateLimit-Remaining") == "-1"
        assert "WRONGPASS" in d2.log() and "(check redis.username and the variable " \
            "redis.password_env names)" in d2.log(), d2.log()
        for dd, pw in ((d, PASSWORD), (d2, wrong)):
            assert pw not in requests.get(dd.url("/v1/policy"), timeout=2).text
            assert pw not in dd.log(), dd.log()
    finally:
        proc.kill()
        proc.wait()


def test_route_info_names_the_routes_in_force(ops_daemon):
    """One series per route in force, saying whether it is a shadow route
    and how it fails (what its failed_closed and shadow_denied counts
    mean); a route a reload removed is gone from it."""
    d = ops_daemon(policy(
        route("lim", "/api/", fw(3)) +
        route("trial", "/t/", fw(3), extra="    shadow: true\n    failure_mode: closed\n") +
        route("smooth", "/s/", '{algorithm: leaky_bucket, rate: "5/s", burst: 5}') +
        route("police", "/p/", '{algorithm: leaky_bucket, rate: "5/s", burst: 5, delay: false}',
              extra="    overrides:\n      - keys: [vip]\n        limits: [{algorithm: "
                    'leaky_bucket, rate: "9/s", burst: 9, delay: true}]\n') +
        route("watch", "/w/", '{algorithm: leaky_bucket, rate: "5/s", burst: 5}',
              extra="    shadow: true\n")))
    info = {(l["route"], l["shadow"], l["failure_mode"], l["shapes"])
            for n, l, v in scrape(d).samples if n == "ratelimitd_route_info" and v == 1}
    assert info == {("lim", "false", "open", "false"), ("trial", "true", "closed", "false"),
                    ("smooth", "false", "open", "true"),     # delay: true is the default
                    ("police", "false", "open", "true"),     # an override shapes
                    ("watch", "true", "open", "false")}, info  # a shadow route holds none
    d.write_policy(policy(route("lim", "/api/", fw(3))))
    assert wait_until(lambda: {l["route"] for n, l, v in scrape(d).samples
                               if n == "ratelimitd_route_info"} == {"lim"}, timeout=5)


def limit_denials(m):
    return {(l["route"], l["limit"]): v for n, l, v in m.samples
            if n == "ratelimitd_limit_denials_total"}


def test_limit_denials_say_which_limit_refused(ops_daemon):
    """A route with a burst and an hourly limit: each denial counts under
    every limit that refused it, so an operator sees which one denies.
    Denials answered from the deny cache count too, shadow ones as well;
    the limits in force (an override's included) show from 0, and after
    a reload what was counted stays."""
    d = ops_daemon(policy(
        route("api", "/api/", fw(3, "burst") + ", " + fw(5, "hourly"),
              extra="    overrides: [{keys: [vip], limits: [{name: vip, algorithm: "
                    "fixed_window, limit: 1, window: 1h}]}]\n") +
        route("sh", "/sh/", fw(1, "one"), extra="    shadow: true\n")))
    assert limit_denials(scrape(d)) == {("api", "burst"): 0, ("api", "hourly"): 0,
                                        ("api", "vip"): 0, ("sh", "one"): 0}
    # k1: 3 pass, then 4 denied by burst alone (the later ones from the cache)
    got = [check(d, "/check/api/x", headers={"X-Key": "k1"}).status_code for _ in range(7)]
    assert got == [200] * 3 + [429] * 4
    # k1 has 2 of its hour left and none of its burst: a cost of 3 is
    # refused by both limits at once
    r = vcheck(d, {"route": "api", "key": "k1", "cost": 3})
    assert r.status_code == 429 and [l["allowed"] for l in r.json()["limits"]] == [False, False]
    assert [vcheck(d, {"route": "api", "key": "vip"}).status_code for _ in range(2)] == [200, 429]
    assert [check(d, "/check/sh/x", headers={"X-Key": "s"}).status_code
            for _ in range(3)] == [200] * 3
    m = scrape(d)
    assert limit_denials(m) == {("api", "burst"): 5, ("api", "hourly"): 1,
                                ("api", "vip"): 1, ("sh", "one"): 2}
    assert m.checks("api", "denied") == 6 and m.checks("sh", "shadow_denied") == 2
    d.write_policy(policy(route("api", "/api/", fw(3, "burst"))))
    d.signal(signal.SIGHUP)
    assert wait_until(lambda: "loaded, 1 route" in d.log(), timeout=5)
    assert limit_denials(scrape(d)) == {("api", "burst"): 5, ("api", "hourly"): 1,
                                        ("api", "vip"): 1, ("sh", "one"): 2}


def test_limit_names_past_the_label_table_count_as_other(ops_daemon):
    """4095 (route, limit) names fit; the denials of limits named after
    that count as route and limit "(other)", said once in the log."""
    limits = ", ".join(fw(1, "l%d" % j) for j in range(14))
    d = ops_daemon(policy("".join(route("r%d" % i, "/r%d/" % i, limits)
                                  for i in range(300))))      # 4200 pairs
    for path in ("/check/r0/x", "/check/r299/x"):
        assert [check(d, path, headers={"X-Key": "k"}).status_code
                for _ in range(2)] == [200, 429]
    got = limit_denials(scrape(d))
    assert got[("r0", "l0")] == 1 and got[("r0", "l13")] == 1
    assert got[("(other)", "(other)")] == 14            # r299's are past the table
    assert ("r299", "l0") not in got
    assert len(got) == 4095 + 1
    assert d.log().count('limit="(other)"') == 1, d.log()
