"""The six algorithms driven from outside, through the real daemon and a real
Redis, in real time (SPEC §3, §6; issue 3): a fresh client's burst,
exhaustion, refill after the advertised Retry-After (and never before the
moment a request really passes), the rate-limit headers, window edges, the
leaky bucket's shaping, several algorithms on one route (all-or-nothing,
headline limit, cost), key expiry and a quota-raising reload.

Windows and rates are short so that the whole file runs in well under a
minute; time is read from the test's own Redis client (RedisClock), the
clock the scripts use.
"""
import json
import math
import signal
import time

import pytest
import requests

from algo_helpers import (H, RedisClock, assert_denied, concurrent, fa, fire, jc, join,
                          parse_rat, policy, policy_limits, rkey, route, snapshot)
from conftest import wait_until


# ---------------------------------------------------------------- burst / exhaustion / refill

# Each case: one route, one limit named "q", quota 3. `early`: seconds after
# the first denial at which a request must still be denied (well before the
# moment it really passes); `retry`: the Retry-After values the first denial
# may carry; `reset`: the X-RateLimit-Reset values allowed on the last
# request of the burst (quota = limit for windows, burst for buckets).
BURST_CASES = {
    "fixed_window": dict(
        limit="{name: q, algorithm: fixed_window, limit: 3, window: 2s}",
        align=2.0, early=1.2, retry={2}, reset={2}),
    "sliding_window_log": dict(
        limit="{name: q, algorithm: sliding_window_log, limit: 3, window: 2s}",
        early=1.2, retry={2}, reset={2}),
    # precision 200ms: the burst's bucket [s, s+0.2) counts in full until
    # s+2 and then fades out; one more fits once 3*(s+2.2-t)/0.2 <= 2, i.e.
    # at s+2.067: 1.87..2.07 s after the denial.
    "sliding_window_counter": dict(
        limit="{name: q, algorithm: sliding_window_counter, limit: 3, window: 2s,"
              " precision: 200ms}",
        early=1.2, retry={2, 3}, reset={2, 3}),
    "token_bucket": dict(
        limit='{name: q, algorithm: token_bucket, rate: "1/s", burst: 3}',
        early=0.5, retry={1}, reset={3}),
    "leaky_bucket_police": dict(
        limit='{name: q, algorithm: leaky_bucket, rate: "1/s", burst: 3, delay: false}',
        early=0.5, retry={1}, reset={3}),
    # shaping: the burst must be sent concurrently (replies are held 0, 0.5,
    # 1.0 s); the 4th, 50 ms later, fits again ~0.45 s after its denial.
    "leaky_bucket_shape": dict(
        limit='{name: q, algorithm: leaky_bucket, rate: "2/s", burst: 3, delay: true}',
        early=0.2, retry={1}, reset={2}, shaping=True),
    "gcra": dict(
        limit='{name: q, algorithm: gcra, rate: "1/s", burst: 3}',
        early=0.5, retry={1}, reset={3}),
}

ALG_OF = {"leaky_bucket_police": "leaky_bucket", "leaky_bucket_shape": "leaky_bucket"}


@pytest.mark.parametrize("case", sorted(BURST_CASES))
def test_burst_exhaust_refill(start_daemon, redis_server, case):
    c = BURST_CASES[case]
    alg = ALG_OF.get(case, case)
    rname = "r" + alg.replace("_", "")[:6]
    pol = policy([route(rname, [c["limit"]])])
    d = start_daemon(pol)
    # a second sidecar on the same Redis: it has not seen the denial, so it
    # asks Redis (the first one may answer a repeat denial from its cache)
    d2 = start_daemon(pol)
    r = redis_server.client()
    clock = RedisClock(r)
    key = "fresh1"

    if c.get("align"):
        clock.align(c["align"], 0.05)

    # burst: exactly the quota passes
    threads = None
    if c.get("shaping"):
        # sent at once; the replies are held 0, 0.5 and 1.0 s, so they are
        # collected at the end, and everything below runs meanwhile
        t0, threads, out = concurrent([lambda: fa(d, rname, key)] * 3)
        time.sleep(0.05)
        s4 = time.monotonic()
        deny = fa(d, rname, key)
        td = clock.local_now()
        # the denial is not held behind the shaped replies
        assert time.monotonic() - s4 < 0.1
    else:
        resps = [fa(d, rname, key) for _ in range(3)]
        deny = fa(d, rname, key)
        td = clock.local_now()
        check_burst(resps, c)

    # exhaustion: the next is denied with Retry-After and the JSON body
    ra = assert_denied(deny, rname)
    assert ra in c["retry"], (ra, c["retry"])
    hd = H(deny)
    assert hd["limit"] == 3 and hd["remaining"] == 0
    assert hd["reset"] >= 1

    # the same through /v1/check: denied, nothing charged, retry in seconds
    v = jc(d, rname, key)
    assert v.status_code == 429, v.text
    vb = v.json()
    assert vb["allowed"] is False and vb["remaining"] == 0 and vb["limit"] == 3
    assert vb["retry_after"] in (ra - 1, ra) and vb["retry_after"] >= 1
    assert vb["limits"][0]["algorithm"] == alg and vb["limits"][0]["allowed"] is False

    # well before the moment it really passes: still denied
    clock.sleep_until(td + c["early"])
    for dd in (d2, d):
        early = fa(dd, rname, key)
        assert early.status_code == 429, (case, "passed %.2fs after a denial that said "
                                          "Retry-After %d" % (c["early"], ra))
        assert 1 <= H(early)["retry"] <= ra

    # after waiting the advertised Retry-After: passes
    clock.sleep_until(td + ra + 0.02)
    ok = fa(d, rname, key)
    assert ok.status_code == 200, (case, ok.status_code, ok.text,
                                   "denied %ds after Retry-After %d" % (ra, ra))
    assert H(ok)["limit"] == 3 and 0 <= H(ok)["remaining"] <= 2
    if threads is not None:
        join(threads)
        for res, _ in out:
            assert not isinstance(res, Exception), res
        check_burst(sorted((x for x, _ in out), key=lambda x: -H(x)["remaining"]), c)


def check_burst(resps, c):
    assert [x.status_code for x in resps] == [200] * 3, [x.text for x in resps]
    assert [H(x)["remaining"] for x in resps] == [2, 1, 0]
    for x in resps:
        assert x.text == ""
        assert H(x)["limit"] == 3
        assert H(x)["retry"] is None
    assert H(resps[-1])["reset"] in c["reset"], (H(resps[-1]), c["reset"])


# ---------------------------------------------------------------- window edges

FW = policy([route("fw", ["{name: q, algorithm: fixed_window, limit: 3, window: 2s}"])])


def test_fixed_window_twice_limit_across_boundary(start_daemon, redis_server):
    d = start_daemon(FW)
    d2 = start_daemon(FW)                   # same Redis, no cached denial
    r = redis_server.client()
    clock = RedisClock(r)
    start = clock.align(2.0, 1.72)          # 0.28 s before the boundary
    first = [fa(d, "fw", "e1") for _ in range(3)]
    assert [x.status_code for x in first] == [200] * 3
    assert H(first[-1])["reset"] == 1       # 0.2x s to the window's end, rounded up
    deny = fa(d, "fw", "e1")
    assert assert_denied(deny, "fw") == 1
    # still the old window just before the edge
    clock.sleep_until(start + 2.0 - 0.08)
    assert fa(d2, "fw", "e1").status_code == 429
    assert fa(d, "fw", "e1").status_code == 429
    # just after it: a whole new quota
    clock.sleep_until(start + 2.0 + 0.03)
    second = [fa(d, "fw", "e1") for _ in range(3)]
    t_end = clock.local_now()
    assert [x.status_code for x in second] == [200] * 3, [x.text for x in second]
    assert [H(x)["remaining"] for x in second] == [2, 1, 0]
    assert assert_denied(fa(d, "fw", "e1"), "fw") == 2
    # 2 x limit admitted within well under one window
    assert t_end - (start + 1.72) < 1.0
    st = r.hgetall(rkey("fw", "e1", "q", "fixed_window"))
    assert int(st[b"n"]) == 3 and int(st[b"s"]) == int((start + 2.0) * 1e6)


SWL = policy([route("swl", ["{name: q, algorithm: sliding_window_log, limit: 3, window: 2s}"]),
              route("swl1", ["{name: q, algorithm: sliding_window_log, limit: 3, window: 1s}"])])


def test_sliding_log_exact_at_the_edge(start_daemon, redis_server):
    d = start_daemon(SWL)
    r = redis_server.client()
    clock = RedisClock(r)
    k = rkey("swl", "s1", "q", "sliding_window_log")
    for i in range(3):
        assert fa(d, "swl", "s1").status_code == 200
        if i < 2:
            time.sleep(0.5)
    deny = fa(d, "swl", "s1")
    assert assert_denied(deny, "swl") == 1          # the oldest leaves in ~1.0 s
    times = [s / 1e6 for _, s in r.zrange(k, 0, -1, withscores=True)]
    assert len(times) == 3 and times[1] - times[0] > 0.4 and times[2] - times[1] > 0.4
    # the first slot frees exactly when the first request leaves the window
    clock.sleep_until(times[0] + 2.0 - 0.08)
    assert fa(d, "swl", "s1").status_code == 429
    clock.sleep_until(times[0] + 2.0 + 0.03)
    assert fa(d, "swl", "s1").status_code == 200
    # only one slot: the second request is still in the window
    deny = fa(d, "swl", "s1")
    assert assert_denied(deny, "swl") == 1
    clock.sleep_until(times[1] + 2.0 - 0.08)
    assert fa(d, "swl", "s1").status_code == 429
    clock.sleep_until(times[1] + 2.0 + 0.03)
    ok = fa(d, "swl", "s1")
    assert ok.status_code == 200 and H(ok)["remaining"] == 0
    assert H(ok)["reset"] == 2                       # the newest leaves in 2 s


def test_sliding_log_never_more_than_limit_in_any_window(start_daemon, redis_server):
    d = start_daemon(SWL)
    r = redis_server.client()
    k = rkey("swl1", "h1", "q", "sliding_window_log")
    admitted = []
    end = time.monotonic() + 2.5
    while time.monotonic() < end:
        x = fa(d, "swl1", "h1")
        if x.status_code == 200:
            # the exact time the script stored for it
            admitted.append(r.zrange(k, -1, -1, withscores=True)[0][1])
        else:
            assert x.status_code == 429
        time.sleep(0.03)
    admitted.sort()
    W = 1_000_000
    for i, t in enumerate(admitted):
        inside = [u for u in admitted if t - W < u <= t]
        assert len(inside) <= 3, (i, [u - t for u in inside])
    # and not stricter than that: 3 per second over 2.5 s
    assert len(admitted) >= 7, len(admitted)


SWC = policy([route("swc", ["{name: q, algorithm: sliding_window_counter, limit: 4,"
                            " window: 2s, precision: 1s}"])])


def test_sliding_window_counter_weights_the_old_bucket(start_daemon, redis_server):
    """4 requests at the start of a 1 s bucket; 2.3 s later that bucket still
    weighs 0.7 (4 * 0.7 = 2.8), so exactly one more fits, where a fixed or
    exact sliding window would admit four."""
    d = start_daemon(SWC)
    r = redis_server.client()
    clock = RedisClock(r)
    s = clock.align(1.0, 0.05)
    assert [fa(d, "swc", "c1").status_code for _ in range(4)] == [200] * 4
    deny = fa(d, "swc", "c1")
    # bucket s weighs 4 * (s + 3 - t); one more fits once that is <= 3, at
    # s + 2.25, i.e. ~2.2 s after this denial
    assert assert_denied(deny, "swc") == 3
    st = r.hgetall(rkey("swc", "c1", "q", "sliding_window_counter"))
    assert st == {str(int(s * 1e6)).encode(): b"4"}
    clock.sleep_until(s + 2.15)                      # 3.4 + 1 > 4
    assert fa(d, "swc", "c1").status_code == 429
    clock.sleep_until(s + 2.3)                       # 2.8 + 1 <= 4
    x = fa(d, "swc", "c1")
    assert x.status_code == 200, x.text
    assert H(x)["remaining"] == 0                    # floor(4 - 3.8)
    # 3.8 + 1 > 4: denied, although every old request is over 2 s old
    deny = fa(d, "swc", "c1")
    assert assert_denied(deny, "swc") == 1           # fits again at s + 2.5
    clock.sleep_until(s + 2.55)
    assert fa(d, "swc", "c1").status_code == 200


# ---------------------------------------------------------------- token bucket, fractional rate

TB_FRAC = policy([route("tbf", ['{name: q, algorithm: token_bucket, rate: "5/10s", burst: 3}'])])


def test_token_bucket_fractional_rate_one_token_every_two_seconds(start_daemon, redis_server):
    d = start_daemon(TB_FRAC)
    d2 = start_daemon(TB_FRAC)                       # same Redis, no cached denial
    r = redis_server.client()
    clock = RedisClock(r)
    k = rkey("tbf", "f1", "q", "token_bucket")
    oks = [fa(d, "tbf", "f1") for _ in range(3)]
    assert [x.status_code for x in oks] == [200] * 3
    assert [H(x)["remaining"] for x in oks] == [2, 1, 0]
    assert H(oks[-1])["reset"] == 6                  # 3 tokens at 0.5/s
    assert assert_denied(fa(d, "tbf", "f1"), "tbf") == 2
    t3 = int(r.hget(k, "ts")) / 1e6                  # the last charge, exact
    # half a token after 1 s: still denied, one more second to go
    clock.sleep_until(t3 + 1.0)
    x = fa(d2, "tbf", "f1")
    assert x.status_code == 429 and H(x)["retry"] == 1 and H(x)["remaining"] == 0
    v = jc(d2, "tbf", "f1").json()
    assert v["allowed"] is False and v["retry_after"] == 1
    assert fa(d, "tbf", "f1").status_code == 429
    # a hair before 2 s: still denied; just after: one token, one request
    clock.sleep_until(t3 + 2.0 - 0.1)
    assert fa(d2, "tbf", "f1").status_code == 429
    assert fa(d, "tbf", "f1").status_code == 429
    clock.sleep_until(t3 + 2.0 + 0.03)
    x = fa(d, "tbf", "f1")
    assert x.status_code == 200 and H(x)["remaining"] == 0
    assert assert_denied(fa(d, "tbf", "f1"), "tbf") == 2


# ---------------------------------------------------------------- gcra

GCRA = policy([route("gc", ['{name: q, algorithm: gcra, rate: "2/3s", burst: 4}'])])


def test_gcra_burst_and_retry_after_matches_the_wait(start_daemon, redis_server):
    d = start_daemon(GCRA)
    d2 = start_daemon(GCRA)                          # same Redis, no cached denial
    r = redis_server.client()
    clock = RedisClock(r)
    k = rkey("gc", "g1", "q", "gcra")
    T, tau = 1.5, 4 * 1.5
    # burst + 1 at once: exactly `burst` pass (redis-cell would admit 5)
    _, replies = fire(d.port, "gc", "g1", 5)
    oks = [x for x in replies if x.status_code == 200]
    assert len(oks) == 4, [x.status_code for x in replies]
    assert sorted(H(x)["remaining"] for x in oks) == [0, 1, 2, 3]
    last = [x for x in oks if H(x)["remaining"] == 0][0]
    assert H(last)["reset"] == 6 and H(last)["limit"] == 4
    assert_denied([x for x in replies if x.status_code != 200][0], "gc")
    # the same limit on a fresh client through /v1/check, one by one
    oks = [jc(d, "gc", "g0") for _ in range(4)]
    assert [x.json()["remaining"] for x in oks] == [3, 2, 1, 0]
    assert oks[-1].json()["reset"] == 6
    assert jc(d, "gc", "g0").status_code == 429
    # retry_after through the other sidecar (no cached denial there)
    a = clock.local_now()
    deny = jc(d2, "gc", "g1")
    b = clock.local_now()
    assert deny.status_code == 429
    tat = parse_rat(r.get(k)) / 1e6
    passes_at = tat + T - tau                        # the first conforming moment
    ra = deny.json()["retry_after"]
    # retry_after (whole seconds) is the real wait rounded up
    assert math.ceil(passes_at - b - 0.001) <= ra <= math.ceil(passes_at - a + 0.001), \
        (ra, passes_at - a, passes_at - b)
    assert ra == 2 and H(deny)["retry"] == 2
    # before the moment: denied, and it says one more second
    clock.sleep_until(passes_at - 0.3)
    for dd in (d2, d):
        x = jc(dd, "gc", "g1")
        assert x.status_code == 429 and x.json()["retry_after"] == 1
    clock.sleep_until(passes_at + 0.03)
    x = jc(d, "gc", "g1")
    assert x.status_code == 200, x.text
    # one cell only; then wait exactly what the denial says, and pass
    deny = jc(d, "gc", "g1")
    td = clock.local_now()
    ra = deny.json()["retry_after"]
    assert deny.status_code == 429 and ra == 2
    clock.sleep_until(td + ra)
    x = jc(d, "gc", "g1")
    assert x.status_code == 200, x.text


# ---------------------------------------------------------------- leaky bucket shaping / policing

LEAKY = policy([
    route("shape", ['{name: q, algorithm: leaky_bucket, rate: "5/s", burst: 5, delay: true}']),
    route("police", ['{name: q, algorithm: leaky_bucket, rate: "5/s", burst: 5, delay: false}']),
])


def test_leaky_bucket_delay_true_spaces_replies(start_daemon, redis_server):
    d = start_daemon(LEAKY)
    # warm up the daemon's connection to Redis on another key
    assert fa(d, "shape", "warm").status_code == 200
    # 6 at once: 5 fit in the queue, one does not
    t0, replies = fire(d.port, "shape", "sh1", 6)
    denied = [x for x in replies if x.status_code != 200]
    out = [x for x in replies if x.status_code == 200]
    assert len(out) == 5 and len(denied) == 1, [x.status_code for x in replies]
    sixth = denied[0]
    sixth_latency = sixth.t - t0
    # in order: the reply that says Remaining r is the (5-r)-th in the queue
    by_rem = sorted(((H(x)["remaining"], x.t - t0) for x in out), reverse=True)
    assert [rem for rem, _ in by_rem] == [4, 3, 2, 1, 0]
    times = [t for _, t in by_rem]
    for i, t in enumerate(times):
        assert abs(t - 0.2 * i) <= 0.08, ("reply %d at %.3f s, expected %.1f s" %
                                          (i, t, 0.2 * i), times)
    for a, b in zip(times, times[1:]):
        assert 0.12 <= b - a <= 0.28, times
    assert max(times) <= 1.0                          # burst / rate
    # the 6th: denied at once, not held behind the queue
    assert sixth.status_code == 429
    assert H(sixth)["retry"] == 1 and H(sixth)["remaining"] == 0
    assert json.loads(sixth.text) == {"error": "rate_limited", "route": "shape",
                                      "retry_after": 1}
    assert sixth_latency < 0.1, sixth_latency


def test_leaky_bucket_delay_false_answers_at_once(start_daemon, redis_server):
    d = start_daemon(LEAKY)
    assert fa(d, "police", "warm").status_code == 200
    t0, replies = fire(d.port, "police", "p1", 6)
    out = [x for x in replies if x.status_code == 200]
    denied = [x for x in replies if x.status_code != 200]
    assert len(out) == 5 and len(denied) == 1, [x.status_code for x in replies]
    assert sorted(H(x)["remaining"] for x in out) == [0, 1, 2, 3, 4]
    # every reply at once, none held
    assert max(x.t - t0 for x in replies) < 0.1, [x.t - t0 for x in replies]
    assert denied[0].status_code == 429 and H(denied[0])["retry"] == 1
    assert json.loads(denied[0].text)["error"] == "rate_limited"


# ---------------------------------------------------------------- several algorithms on one route

MIX_LIMITS = [
    '{name: tb, algorithm: token_bucket, rate: "1/10s", burst: 10}',
    "{name: fw, algorithm: fixed_window, limit: 8, window: 1h}",
    "{name: swl, algorithm: sliding_window_log, limit: 6, window: 1m}",
    '{name: gc, algorithm: gcra, rate: "1/10s", burst: 7}',
]
MIX = policy([
    route("mix", MIX_LIMITS),
    route("tie", ["{name: short, algorithm: fixed_window, limit: 5, window: 2s}",
                  "{name: long, algorithm: sliding_window_log, limit: 5, window: 30s}"]),
    route("tie2", ["{name: long, algorithm: sliding_window_log, limit: 5, window: 30s}",
                   "{name: short, algorithm: fixed_window, limit: 5, window: 2s}"]),
    route("low", ["{name: big, algorithm: sliding_window_log, limit: 10, window: 30s}",
                  "{name: small, algorithm: fixed_window, limit: 3, window: 2s}"]),
    route("mixrt", ['{name: tb, algorithm: token_bucket, rate: "1/s", burst: 3}',
                    "{name: swl, algorithm: sliding_window_log, limit: 4, window: 2s}"]),
])
MIX_ALGS = [("tb", "token_bucket"), ("fw", "fixed_window"), ("swl", "sliding_window_log"),
            ("gc", "gcra")]


def mix_keys(client):
    return [rkey("mix", client, n, a) for n, a in MIX_ALGS]


def rem(v):
    return [l["remaining"] for l in v["limits"]]


def test_mixed_route_all_or_nothing_and_headline(start_daemon, redis_server):
    d = start_daemon(MIX)
    r = redis_server.client()
    RedisClock(r).avoid_boundary(3600, 30)
    v = jc(d, "mix", "m1", cost=2)
    assert v.status_code == 200, v.text
    b = v.json()
    assert [(l["name"], l["algorithm"]) for l in b["limits"]] == MIX_ALGS
    assert [l["limit"] for l in b["limits"]] == [10, 8, 6, 7]
    assert rem(b) == [8, 6, 4, 5]
    # headline: the lowest remaining (swl), headers agree with the body
    assert (b["limit"], b["remaining"]) == (6, 4)
    assert H(v)["limit"] == 6 and H(v)["remaining"] == 4 and H(v)["reset"] == b["reset"] == 60
    v = jc(d, "mix", "m1", cost=3)
    assert v.status_code == 200 and rem(v.json()) == [5, 3, 1, 2]
    before = snapshot(r, mix_keys("m1"))
    assert all(before[k] is not None for k in mix_keys("m1"))

    # cost 2: swl (1 left) denies, the others would allow: nothing charged
    v = jc(d, "mix", "m1", cost=2)
    assert v.status_code == 429, v.text
    b = v.json()
    assert b["allowed"] is False
    assert [l["allowed"] for l in b["limits"]] == [True, True, False, True]
    assert rem(b) == [5, 3, 1, 2]                    # what was left before
    assert (b["limit"], b["remaining"]) == (6, 1)
    assert 59 <= b["retry_after"] <= 60 and H(v)["retry"] == b["retry_after"]
    assert snapshot(r, mix_keys("m1")) == before

    # forward-auth, cost 1: passes and charges all four
    x = fa(d, "mix", "m1")
    assert x.status_code == 200
    assert (H(x)["limit"], H(x)["remaining"]) == (6, 0)
    after = snapshot(r, mix_keys("m1"))
    assert all(after[k] != before[k] for k in mix_keys("m1")), (before, after)
    # denied by swl alone: nothing charged, headline is swl at 0
    x = fa(d, "mix", "m1")
    assert_denied(x, "mix")
    assert (H(x)["limit"], H(x)["remaining"]) == (6, 0)
    assert snapshot(r, mix_keys("m1")) == after
    assert rem(jc(d, "mix", "m1").json()) == [4, 2, 0, 1]

    # two deny at once (swl and gcra): Retry-After is the longer wait
    v = jc(d, "mix", "m2", cost=6)
    assert v.status_code == 200 and rem(v.json()) == [4, 2, 0, 1]
    v = jc(d, "mix", "m2", cost=2)
    b = v.json()
    assert v.status_code == 429
    assert [l["allowed"] for l in b["limits"]] == [True, True, False, False]
    assert 59 <= b["retry_after"] <= 60

    # a fresh client denied by one limit (cost 7 > swl's 6) writes nothing
    v = jc(d, "mix", "m3", cost=7)
    assert v.status_code == 429, v.text
    assert [l["allowed"] for l in v.json()["limits"]] == [True, True, False, True]
    assert r.exists(*mix_keys("m3")) == 0
    # cost 10 = the largest quota: a denial (fw, swl, gc), not an error
    v = jc(d, "mix", "m3", cost=10)
    assert v.status_code == 429, v.text
    assert [l["allowed"] for l in v.json()["limits"]] == [True, False, False, False]
    assert r.exists(*mix_keys("m3")) == 0
    # above the largest quota: 400, and nothing written
    for cost in (11, 1000):
        v = jc(d, "mix", "m3", cost=cost)
        assert v.status_code == 400, (cost, v.status_code, v.text)
        assert "error" in v.json()
    assert r.exists(*mix_keys("m3")) == 0
    # every key written has an expiry
    for k in r.scan_iter("rl:*"):
        assert r.pttl(k) > 0, k


def test_mixed_route_headline_tie_takes_longest_reset(start_daemon, redis_server):
    d = start_daemon(MIX)
    RedisClock(redis_server.client()).align(2.0, 0.1)
    for rn in ("tie", "tie2"):
        v = jc(d, rn, "t1")
        assert v.status_code == 200
        b = v.json()
        assert rem(b) == [4, 4]
        assert b["remaining"] == 4 and b["reset"] == 30, (rn, b)
        assert H(v)["reset"] == 30 and H(v)["remaining"] == 4 and H(v)["limit"] == 5
        x = fa(d, rn, "t1")
        assert H(x)["reset"] == 30 and H(x)["remaining"] == 3
    # lowest remaining wins over a longer reset
    v = jc(d, "low", "t1")
    b = v.json()
    assert rem(b) == [9, 2]
    assert (b["limit"], b["remaining"]) == (3, 2) and b["reset"] <= 2
    assert (H(v)["limit"], H(v)["remaining"]) == (3, 2)


def test_mixed_route_in_real_time(start_daemon, redis_server):
    """token_bucket 3 @ 1/s with sliding_window_log 4 / 2s on one route."""
    d = start_daemon(MIX)
    d2 = start_daemon(MIX)                            # same Redis, no cached denial
    r = redis_server.client()
    clock = RedisClock(r)
    zk = rkey("mixrt", "rt1", "swl", "sliding_window_log")
    xs = [fa(d, "mixrt", "rt1") for _ in range(3)]
    assert [x.status_code for x in xs] == [200] * 3
    assert [H(x)["remaining"] for x in xs] == [2, 1, 0]
    assert H(xs[-1])["limit"] == 3                    # the bucket is the tighter
    deny = fa(d, "mixrt", "rt1")
    td = clock.local_now()
    assert assert_denied(deny, "mixrt") == 1
    assert r.zcard(zk) == 3                           # the denial charged nothing
    clock.sleep_until(td + 0.5)
    assert fa(d2, "mixrt", "rt1").status_code == 429
    assert fa(d, "mixrt", "rt1").status_code == 429
    clock.sleep_until(td + 1.02)
    x = fa(d, "mixrt", "rt1")
    assert x.status_code == 200, x.text
    # both at 0 now: the tie goes to the longer reset (bucket: 3 s to full)
    assert (H(x)["limit"], H(x)["remaining"], H(x)["reset"]) == (3, 0, 3)
    deny = fa(d, "mixrt", "rt1")
    td = clock.local_now()
    b = jc(d, "mixrt", "rt1").json()
    assert [l["allowed"] for l in b["limits"]] == [False, False]
    ra = assert_denied(deny, "mixrt")
    assert ra == 1
    clock.sleep_until(td + ra + 0.02)
    assert fa(d, "mixrt", "rt1").status_code == 200
    times = sorted(s for _, s in r.zrange(zk, 0, -1, withscores=True))
    assert all(t - 2_000_000 < times[0] for t in times) and len(times) <= 4


# ---------------------------------------------------------------- keys and expiry

TTL = policy([
    route("kfw", ["{name: q, algorithm: fixed_window, limit: 5, window: 2s}"]),
    route("kswl", ["{name: q, algorithm: sliding_window_log, limit: 5, window: 2s}"]),
    route("kswc", ["{name: q, algorithm: sliding_window_counter, limit: 5, window: 2s,"
                   " precision: 500ms}"]),
    route("ktb", ['{name: q, algorithm: token_bucket, rate: "5/s", burst: 5}']),
    route("klb", ['{name: q, algorithm: leaky_bucket, rate: "5/s", burst: 5, delay: false}']),
    route("kgc", ['{name: q, algorithm: gcra, rate: "5/s", burst: 5}']),
])


def test_every_key_has_a_ttl_no_longer_than_needed(start_daemon, redis_server):
    d = start_daemon(TTL)
    r = redis_server.client()
    clock = RedisClock(r)
    clock.align(2.0, 0.1)
    routes = [("kfw", "fixed_window"), ("kswl", "sliding_window_log"),
              ("kswc", "sliding_window_counter"), ("ktb", "token_bucket"),
              ("klb", "leaky_bucket"), ("kgc", "gcra")]
    for rn, _ in routes:
        for _ in range(3):
            assert fa(d, rn, "ttl1").status_code == 200
    now = clock.local_now()
    w_end = (now // 2.0 + 1) * 2.0
    expected = {   # (lowest, highest) PTTL in ms right after the 3 requests
        "kfw": ((w_end - now) * 1000 - 80, (w_end - now) * 1000 + 6),
        "kswl": (2000 - 80, 2001),    # (+1: expiry_ms in lib.lua)
        "kswc": (2000 - 80, 2501),
        "ktb": (600 - 80, 601),       # 3 tokens to refill at 5/s
        "klb": (600 - 80, 601),       # 3 queued, drained at 5/s
        "kgc": (600 - 80, 601),       # TAT 0.6 s ahead
    }
    found = {k.decode() for k in r.scan_iter("*")}
    assert found == {rkey(rn, "ttl1", "q", alg) for rn, alg in routes}, found
    for rn, alg in routes:
        k = rkey(rn, "ttl1", "q", alg)
        ttl = r.pttl(k)
        lo, hi = expected[rn]
        assert lo <= ttl <= hi, (rn, ttl, lo, hi)
    # the buckets are full again after 0.6 s: their keys are gone
    clock.sleep_until(now + 0.65)
    for rn, alg in routes[3:]:
        assert not r.exists(rkey(rn, "ttl1", "q", alg)), rn
    # and a fresh start there: a full quota
    x = fa(d, "ktb", "ttl1")
    assert H(x)["remaining"] == 4


# ---------------------------------------------------------------- reload raising a quota

def reload_policy(q):
    return policy([
        route("lfw", ["{name: q, algorithm: fixed_window, limit: %d, window: 1h}" % q]),
        route("lswl", ["{name: q, algorithm: sliding_window_log, limit: %d, window: 1m}" % q]),
        route("lswc", ["{name: q, algorithm: sliding_window_counter, limit: %d, window: 1m}" % q]),
        route("ltb", ['{name: q, algorithm: token_bucket, rate: "1/m", burst: %d}' % q]),
        route("llb", ['{name: q, algorithm: leaky_bucket, rate: "1/m", burst: %d,'
                      ' delay: false}' % q]),
        route("lgc", ['{name: q, algorithm: gcra, rate: "1/m", burst: %d}' % q]),
    ])


RELOAD_ROUTES = ["lfw", "lswl", "lswc", "ltb", "llb", "lgc"]


@pytest.mark.parametrize("rn", RELOAD_ROUTES)
def test_reload_raising_quota_keeps_the_count(start_daemon, redis_server, rn):
    """Exhaust a quota of 3 (3 used), raise it to 5 by SIGHUP: exactly 2 more
    pass, whatever the algorithm keeps in Redis."""
    d = start_daemon(reload_policy(3))
    r = redis_server.client()
    RedisClock(r).avoid_boundary(3600, 20)
    assert [fa(d, rn, "rl1").status_code for _ in range(3)] == [200] * 3, rn
    assert_denied(fa(d, rn, "rl1"), rn)            # exhausted (and deny-cached)
    d.write_policy(reload_policy(5))
    d.signal(signal.SIGHUP)

    def raised():
        lim = policy_limits(d)[rn][0]
        return (lim.get("limit") or lim.get("burst")) == 5
    assert wait_until(raised, timeout=5), requests.get(d.url("/v1/policy")).text
    a = fa(d, rn, "rl1")
    assert a.status_code == 200, (rn, a.status_code, a.text,
                                  "3 of 5 used after the reload, yet denied")
    assert (H(a)["limit"], H(a)["remaining"]) == (5, 1), (rn, H(a))
    b = fa(d, rn, "rl1")
    assert b.status_code == 200 and H(b)["remaining"] == 0, (rn, H(b))
    assert_denied(fa(d, rn, "rl1"), rn)
    assert d.alive()


# ---------------------------------------------------------------- cost and retry_after

COST = policy([
    route("ctb", ['{name: q, algorithm: token_bucket, rate: "1/s", burst: 3}']),
    route("cgc", ['{name: q, algorithm: gcra, rate: "1/s", burst: 3}']),
])


@pytest.mark.parametrize("rn", ["ctb", "cgc"])
def test_retry_after_of_a_bigger_cost_is_its_own_wait(start_daemon, redis_server, rn):
    """After a denial of cost 1, a denied request of cost 3 must be told the
    wait for 3 units (3 s at 1/s), not the wait for 1: waiting what it was
    told must let it pass."""
    d = start_daemon(COST)
    d2 = start_daemon(COST)                           # same Redis, no cached denial
    clock = RedisClock(redis_server.client())
    assert jc(d, rn, "c1", cost=3).status_code == 200  # empty now
    v1 = jc(d, rn, "c1", cost=1)
    assert v1.status_code == 429 and v1.json()["retry_after"] == 1
    v3 = jc(d, rn, "c1", cost=3)
    td = clock.local_now()
    truth = jc(d2, rn, "c1", cost=3)
    assert v3.status_code == 429 and truth.status_code == 429
    assert truth.json()["retry_after"] == 3
    assert v3.json()["retry_after"] == 3, ("cost 3 told to retry after %ds, really %ds"
                                           % (v3.json()["retry_after"],
                                              truth.json()["retry_after"]))
    assert H(v3)["retry"] == 3
    clock.sleep_until(td + 3.02)
    assert jc(d, rn, "c1", cost=3).status_code == 200


def test_default_precision_shown_as_in_force(start_daemon):
    """window/10 of a window that is not a multiple of 10ms is not whole
    milliseconds: /v1/policy says what the buckets really are."""
    d = start_daemon(policy([
        route("a", ["{name: q, algorithm: sliding_window_counter, limit: 5, window: 1001ms}"]),
        route("b", ["{name: q, algorithm: sliding_window_counter, limit: 5, window: 13ms}"]),
        route("c", ["{name: q, algorithm: sliding_window_counter, limit: 5, window: 1m}"]),
    ]))
    lims = policy_limits(d)
    assert [lims[n][0]["precision"] for n in "abc"] == ["100.1ms", "1.3ms", "6s"], lims


def test_sliding_window_counter_past_two_to_the_53(start_daemon):
    """limit x precision (in us) past 2^53 makes the script's doubles round:
    the verdict computed as f + charge <= cap denied a request that fits,
    and the retry sweep, which asked f <= cap - charge, found it passing at
    a slope of 0 and divided by it (a retry of -inf). One expression now
    decides both (found by an audit of numeric extremes)."""
    d = start_daemon(policy([route("s", [
        "{algorithm: sliding_window_counter, limit: 1000000002, window: 1d, precision: 1d}"])]))
    first = jc(d, "s", "k", cost=1000000001)
    assert first.status_code == 200, first.text
    second = jc(d, "s", "k", cost=1)
    assert second.status_code == 200, second.text
    third = jc(d, "s", "k", cost=1)
    to_midnight = 86400 - time.time() % 86400
    assert third.status_code == 429, third.text
    # The day's bucket counts in full until the UTC day ends, then loses
    # a billionth of its count in 86 us: the retry is the day's end, a
    # number of seconds (it was -inf), not "over an hour", which failed
    # the test in the last hour of a day.
    assert abs(int(third.headers["Retry-After"]) - math.ceil(to_midnight)) <= 2, \
        (dict(third.headers), to_midnight)
