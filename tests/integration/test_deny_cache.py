"""The per-worker deny cache answers only what Redis would answer.

A denial is kept until its retry time, so a client over its limit costs no
Redis call, whatever the algorithm: other traffic can only use more quota,
and what time gives back (a bucket's refill, a sliding window's old
requests) the retry time already counts. Two ways that went wrong, found
by an audit with three daemons on one Redis:

  * Timed from the reply's arrival, with the script's millisecond round-up,
    a cached denial outlived the moment Redis would allow: with Redis
    replies 20 ms late, a gcra client at 20/s got 42 requests in 3 s where
    Redis allowed 61. Now it counts from the send, less that millisecond.
  * State can vanish under it (a Redis restarted without persistence): the
    client stayed denied for the rest of its window on the workers that had
    cached it, and was allowed everywhere else. Now an entry holds only
    over the connection it came from.
"""
import re
import time

import pytest
import requests

from conftest import RedisServer, wait_until
from helpers import avoid_hour_boundary  # noqa: F401  (autouse)
from helpers import check, policy, rkey
from proxies import SlowReplies

GCRA = policy(
    "  - name: g\n    match: {prefix: /}\n    key: header:X-Api-Key\n"
    "    limits: [{name: r, algorithm: gcra, rate: 10/s, burst: 1}]\n",
    timeout="500ms")
FW = policy(
    "  - name: f\n    match: {prefix: /}\n    key: ip\n"
    "    limits: [{name: q, algorithm: fixed_window, limit: 2, window: 1h}]\n")


def redis_us(rc):
    sec, usec = rc.time()
    return sec * 1_000_000 + usec


def script_calls(rc):
    return rc.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)


def deny_cache_counts(d):
    """ratelimitd_deny_cache_hits_total and _evictions_total."""
    text = requests.get(d.url("/metrics"), timeout=5).text
    return tuple(int(re.search(r"^ratelimitd_deny_cache_%s_total (\d+)$" % name, text,
                               re.M).group(1)) for name in ("hits", "evictions"))


def test_cached_denial_never_outlives_the_real_one(start_daemon, redis_server):
    """One client at full speed on a gcra of 10/s, burst 1, with every
    Redis reply 20 ms late. A request is admitted by Redis iff it comes at
    or after the stored TAT, so a 429 for a request sent after the TAT was
    a denial Redis would not have made; the TAT only moves when a request
    is admitted, and this client is the only one."""
    proxy = SlowReplies(redis_server.port, 0.020)
    try:
        d = start_daemon(GCRA, redis_port=proxy.port)
        rc = redis_server.client()
        key = rkey("g", "late", "r", "gcra")
        calls0 = script_calls(rc)
        sent_after_tat, denied, allowed, requests_sent = [], 0, 0, 0
        tat = 0
        session = requests.Session()
        end = time.monotonic() + 2.0
        while time.monotonic() < end:
            sent = redis_us(rc)
            r = session.get(d.url("/check/x"), headers={"X-Api-Key": "late"}, timeout=5)
            requests_sent += 1
            if r.status_code == 200:
                allowed += 1
                # the key lives until its TAT (plus 1 ms): read it now
                tat = int(rc.get(key).decode().split("+")[0])
                continue
            assert r.status_code == 429, r.text
            denied += 1
            if sent > tat:
                sent_after_tat.append(sent - tat)
        cached = requests_sent - (script_calls(rc) - calls0)
        assert allowed >= 5 and cached > 50, (allowed, denied, cached)
        assert sent_after_tat == [], (
            "%d of %d denials came after Redis would allow (by %s us)"
            % (len(sent_after_tat), denied, sorted(sent_after_tat)[-5:]))
    finally:
        proxy.close()


def test_cached_denial_forgotten_with_a_new_redis(start_daemon, redis_server, tmp_path):
    d = start_daemon(FW)
    rc = redis_server.client()
    assert [check(d, "/check/x").status_code for _ in range(3)] == [200, 200, 429]
    calls = script_calls(rc)
    r = check(d, "/check/x")
    assert r.status_code == 429 and script_calls(rc) == calls     # from the cache
    redis_server.kill()                     # no persistence: every count is gone
    back = RedisServer(tmp_path, port=redis_server.port).start()
    try:
        assert wait_until(lambda: requests.get(d.url("/readyz"), timeout=2).ok, timeout=5)
        r = check(d, "/check/x")
        assert r.status_code == 200, r.text
        assert r.headers["X-RateLimit-Remaining"] == "1"
    finally:
        back.stop()


def test_no_cached_denial_while_redis_is_unreachable(start_daemon, redis_server, tmp_path):
    """With Redis gone a check gets the failure mode's answer (SPEC 3.1),
    a cached client too: it was still denied with 429 from the cache."""
    d = start_daemon(FW)
    assert [check(d, "/check/x").status_code for _ in range(3)] == [200, 200, 429]
    redis_server.kill()
    assert wait_until(lambda: requests.get(d.url("/readyz"), timeout=2).status_code == 503,
                      timeout=3)
    for _ in range(3):
        r = check(d, "/check/x")
        assert r.status_code == 200, r.text
        assert r.headers["X-RateLimit-Remaining"] == "-1"
    back = RedisServer(tmp_path, port=redis_server.port).start()
    try:
        assert wait_until(lambda: requests.get(d.url("/readyz"), timeout=2).ok, timeout=5)
        assert check(d, "/check/x").headers["X-RateLimit-Remaining"] == "1"
    finally:
        back.stop()


TB_MULTI = policy(
    "  - name: tb\n    match: {prefix: /tb/}\n    key: header:X-Api-Key\n"
    "    limits: [{name: b, algorithm: token_bucket, rate: 5/s, burst: 5}]\n"
    "  - name: multi\n    match: {prefix: /multi/}\n    key: header:X-Api-Key\n"
    "    limits: [{name: burst, algorithm: token_bucket, rate: 5/s, burst: 5},\n"
    "             {name: hour, algorithm: fixed_window, limit: 5, window: 1h}]\n",
    timeout="500ms")


def vcheck_cost(d, route, key, cost=1):
    return requests.post(d.url("/v1/check"), json={"route": route, "key": key, "cost": cost},
                         timeout=5)


def test_cached_reply_is_the_one_redis_would_give(start_daemon, redis_server):
    """A cached denial repeats the whole reply, so it may serve only while
    every number in it stays what time alone makes it. Found by an audit:
    a denial of cost 5 on a token bucket kept saying 0 remaining while the
    bucket refilled (Redis said 3 a second later); on a route with a
    refilling bucket and an exhausted fixed window, the bucket was still
    reported denying 3 s after it had refilled."""
    d = start_daemon(TB_MULTI)
    rc = redis_server.client()
    # Token bucket 5/s: empty it, ask for 5 (denied, 0 left), wait 0.5 s:
    # 2 tokens are back, and the reply must say so.
    assert [vcheck_cost(d, "tb", "k").status_code for _ in range(5)] == [200] * 5
    assert vcheck_cost(d, "tb", "k", 5).json()["remaining"] == 0
    time.sleep(0.5)
    r = vcheck_cost(d, "tb", "k", 5)
    assert r.status_code == 429 and r.json()["remaining"] >= 2, r.text
    # Both limits spent: five requests, then a denial of both.
    for _ in range(5):
        assert vcheck_cost(d, "multi", "m").status_code == 200
    first = vcheck_cost(d, "multi", "m").json()
    assert [x["allowed"] for x in first["limits"]] == [False, False], first
    time.sleep(1.2)                                  # the bucket has refilled 5
    later = vcheck_cost(d, "multi", "m").json()
    assert later["allowed"] is False
    burst = later["limits"][0]
    assert burst["allowed"] is True and burst["remaining"] == 5, later
    # A single-limit denial one unit short holds until that unit is back:
    # still answered without Redis (the hot-key case).
    for _ in range(5):
        check(d, "/check/tb/x", headers={"X-Api-Key": "hot"})
    assert check(d, "/check/tb/x", headers={"X-Api-Key": "hot"}).status_code == 429
    calls = script_calls(rc)
    assert check(d, "/check/tb/x", headers={"X-Api-Key": "hot"}).status_code == 429
    assert script_calls(rc) == calls, "a denial one token short was not cached"


WIDE = policy(
    "  - name: wide\n    match: {prefix: /}\n    key: header:X-Api-Key\n"
    "    limits:\n"
    "      - {name: q, algorithm: fixed_window, limit: 2, window: 1h}\n"
    + "".join("      - {name: l%d, algorithm: fixed_window, limit: %d, window: 1h}\n"
              % (i, 100 + i) for i in range(1, 6))
    + "    overrides:\n"
    "      - {keys: [vip], limits: [{name: v, algorithm: fixed_window, limit: 1, window: 1h}]}\n",
    timeout="500ms")


def without_times(body):
    """A /v1/check body less the times, which a cached denial counts down."""
    out = {k: v for k, v in body.items() if k not in ("reset", "retry_after")}
    if "limits" in out:
        out["limits"] = [without_times(x) for x in out["limits"]]
    return out


def test_a_denial_is_cached_with_room_for_every_limit_it_was_decided_under(start_daemon,
                                                                           redis_server):
    """Denials under up to four limits are kept in one table and under
    more in another, each entry with room for its own: a route of six
    limits, and an override of one on it. Each client's repeats are
    answered without Redis with every limit's numbers as Redis gave them,
    the times no later."""
    d = start_daemon(WIDE)
    rc = redis_server.client()
    for key, quota, nlimits in (("many", 2, 6), ("vip", 1, 1)):
        for _ in range(quota):
            assert vcheck_cost(d, "wide", key).status_code == 200
        first = vcheck_cost(d, "wide", key)
        want = first.json()
        assert first.status_code == 429 and len(want["limits"]) == nlimits, first.text
        calls, hits = script_calls(rc), deny_cache_counts(d)[0]
        for _ in range(5):
            r = vcheck_cost(d, "wide", key)
            got = r.json()
            assert r.status_code == 429 and without_times(got) == without_times(want), r.text
            for a, b in zip(got["limits"] + [got], want["limits"] + [want]):
                assert a["reset"] <= b["reset"], (got, want)
            assert 1 <= got["retry_after"] <= want["retry_after"], (got, want)
        assert script_calls(rc) == calls, key
        assert deny_cache_counts(d) == (hits + 5, 0), key


def test_a_larger_denial_is_not_repeated_after_a_smaller_check_passes(start_daemon):
    """A denial of cost 3 with 2 units left was cached, a check of cost 2
    then passed, and the cached denial went on saying 2 left and
    Retry-After 3 where Redis said 0 and 8 (found by a fleet audit). Such
    a denial is cached only while nothing at all can pass."""
    d = start_daemon(policy(
        "  - name: tb\n    match: {prefix: /tb/}\n    key: header:X-Api-Key\n"
        '    limits: [{name: b, algorithm: token_bucket, rate: "2/5s", burst: 3}]\n'
        "  - name: fw\n    match: {prefix: /fw/}\n    key: header:X-Api-Key\n"
        "    limits: [{name: q, algorithm: fixed_window, limit: 5, window: 1h}]\n",
        timeout="500ms"))

    def ask(route, cost):
        r = requests.post(d.url("/v1/check"), json={"route": route, "key": "big", "cost": cost},
                          timeout=5)
        return r.status_code, r.headers["X-RateLimit-Remaining"], r.headers.get("Retry-After")

    assert ask("tb", 1)[0] == 200
    assert ask("tb", 3)[:2] == (429, "2")
    assert ask("tb", 2)[0] == 200
    status, left, retry = ask("tb", 3)
    assert (status, left) == (429, "0") and int(retry) >= 7, (status, left, retry)
    for _ in range(4):
        assert ask("fw", 1)[0] == 200
    assert ask("fw", 3)[:2] == (429, "1")
    assert ask("fw", 1)[0] == 200
    assert ask("fw", 3)[:2] == (429, "0")


# One route per algorithm, each keyed by X-Api-Key, with a quota of 3 (of
# 1 for the shaping leaky bucket, whose k-th request is held (k - 1)/rate).
ROUTES = [
    ("fw", 3, "algorithm: fixed_window, limit: 3, window: 1h"),
    ("tb", 3, 'algorithm: token_bucket, rate: "1/h", burst: 3'),
    ("gcra", 3, 'algorithm: gcra, rate: "1/h", burst: 3'),
    ("leaky", 3, 'algorithm: leaky_bucket, rate: "1/h", burst: 3, delay: false'),
    ("shaped", 1, 'algorithm: leaky_bucket, rate: "1/h", burst: 1'),
    ("swl", 3, "algorithm: sliding_window_log, limit: 3, window: 1h"),
    ("swc", 3, "algorithm: sliding_window_counter, limit: 3, window: 1h, precision: 1m"),
]
EVERY = policy("".join(
    "  - name: %s\n    match: {prefix: /%s/}\n    key: header:X-Api-Key\n"
    "    limits: [{name: q, %s}]\n" % (name, name, spec) for name, _, spec in ROUTES),
    timeout="500ms")


@pytest.mark.parametrize("route,quota", [(name, quota) for name, quota, _ in ROUTES],
                         ids=[name for name, _, _ in ROUTES])
def test_a_hot_key_costs_no_redis_call_whatever_the_algorithm(start_daemon, redis_server,
                                                             route, quota):
    """Over its limit, a client's next requests are answered without Redis,
    with the reply Redis gave, its times counted down: Remaining 0, Reset
    and Retry-After no later than Redis's."""
    d = start_daemon(EVERY)
    rc = redis_server.client()
    path = "/check/%s/x" % route
    for _ in range(quota):
        assert check(d, path, headers={"X-Api-Key": "hot"}).status_code == 200
    first = check(d, path, headers={"X-Api-Key": "hot"})
    assert first.status_code == 429, first.text
    calls = script_calls(rc)
    hits = deny_cache_counts(d)[0]
    for _ in range(20):
        r = check(d, path, headers={"X-Api-Key": "hot"})
        assert r.status_code == 429, r.text
        assert r.headers["X-RateLimit-Remaining"] == "0"
        assert r.headers["X-RateLimit-Limit"] == str(quota)
        for h in ("X-RateLimit-Reset", "Retry-After"):
            assert 1 <= int(r.headers[h]) <= int(first.headers[h]), (h, r.headers, first.headers)
    assert script_calls(rc) == calls, "%d of 20 denials went to Redis" % (script_calls(rc) - calls)
    assert deny_cache_counts(d) == (hits + 20, 0)    # said in /metrics, nothing given up
    # another client of the route is still asked of Redis
    assert check(d, path, headers={"X-Api-Key": "cold"}).status_code == 200
    assert script_calls(rc) == calls + 1


def test_cached_sliding_denial_never_outlives_the_real_one(start_daemon, redis_server):
    """One client at full speed on a sliding_window_log of 3 per 300 ms and
    a sliding_window_counter of 4 per 400 ms (precision 100 ms), each on
    its own route, with every Redis reply 20 ms late. A denial is wrong
    when, at the Redis time the request was sent, the admissions so far
    left room for it: Redis decides at that time or later, and as time
    passes a sliding window only gives quota back. The admissions are read
    from Redis after each one (this client is the only one), the log's as
    its members' times, the counter's as its bucket counts, and the
    counter's count is computed as the script computes it."""
    proxy = SlowReplies(redis_server.port, 0.020)
    try:
        d = start_daemon(policy(
            "  - name: swl\n    match: {prefix: /swl/}\n    key: header:X-Api-Key\n"
            "    limits: [{name: q, algorithm: sliding_window_log, limit: 3, window: 300ms}]\n"
            "  - name: swc\n    match: {prefix: /swc/}\n    key: header:X-Api-Key\n"
            "    limits: [{name: q, algorithm: sliding_window_counter, limit: 4,\n"
            "              window: 400ms, precision: 100ms}]\n",
            timeout="500ms"), redis_port=proxy.port)
        rc = redis_server.client()
        session = requests.Session()

        def room_in_log(state, t):
            window = 300_000
            return sum(1 for at in state if at > t - window) + 1 <= 3

        def room_in_counter(state, t):
            window, p, cap = 400_000, 100_000, 4 * 100_000
            f = 0
            for start, n in state.items():
                e = start + p + window - t
                if e > 0:
                    f += n * min(e, p)
            return f + p <= cap

        for route, algorithm, room in (("swl", "sliding_window_log", room_in_log),
                                       ("swc", "sliding_window_counter", room_in_counter)):
            key = rkey(route, "late", "q", algorithm)
            calls0 = script_calls(rc)
            state = [] if route == "swl" else {}
            wrong, denied, allowed, sent_total = [], 0, 0, 0
            end = time.monotonic() + 2.0
            while time.monotonic() < end:
                sent = redis_us(rc)
                r = session.get(d.url("/check/%s/x" % route), headers={"X-Api-Key": "late"},
                                timeout=5)
                sent_total += 1
                if r.status_code == 200:
                    allowed += 1
                    if route == "swl":
                        state = [int(score) for _, score in rc.zrange(key, 0, -1, withscores=True)]
                    else:
                        state = {int(k): int(v) for k, v in rc.hgetall(key).items()}
                    continue
                assert r.status_code == 429, r.text
                denied += 1
                if room(state, sent):
                    wrong.append(sent)
            cached = sent_total - (script_calls(rc) - calls0)
            assert allowed >= 10 and cached > 30, (route, allowed, denied, cached)
            assert wrong == [], "%s: %d of %d denials came when Redis would allow" % (
                route, len(wrong), denied)
    finally:
        proxy.close()


@pytest.mark.parametrize("algorithm", ["sliding_window_log", "sliding_window_counter"])
def test_a_larger_sliding_denial_is_asked_while_a_smaller_check_could_pass(start_daemon,
                                                                          redis_server,
                                                                          algorithm):
    """As for the buckets: a denial of cost 2 with 1 left is asked of Redis
    each time (a check of cost 1 may pass meanwhile and change its
    numbers); once nothing is left, a denial of cost 1 is cached."""
    extra = ", precision: 1m" if algorithm == "sliding_window_counter" else ""
    d = start_daemon(policy(
        "  - name: sw\n    match: {prefix: /}\n    key: header:X-Api-Key\n"
        "    limits: [{name: q, algorithm: %s, limit: 3, window: 1h%s}]\n"
        % (algorithm, extra), timeout="500ms"))
    rc = redis_server.client()

    def ask(cost):
        r = requests.post(d.url("/v1/check"), json={"route": "sw", "key": "k", "cost": cost},
                          timeout=5)
        return r.status_code, r.json()["remaining"]

    assert ask(2) == (200, 1)
    calls = script_calls(rc)
    assert [ask(2) for _ in range(3)] == [(429, 1)] * 3
    assert script_calls(rc) == calls + 3              # each asked of Redis
    assert ask(1) == (200, 0)                         # a smaller one passes
    assert ask(2) == (429, 0)
    assert ask(1) == (429, 0)
    calls = script_calls(rc)
    assert [ask(1) for _ in range(5)] == [(429, 0)] * 5
    assert script_calls(rc) == calls                  # from the cache
