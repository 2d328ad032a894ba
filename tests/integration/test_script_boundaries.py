"""Boundary behaviour of the limits script, on a real Redis.

Each test drives the real script (scripts/*.lua concatenated as `make`
concatenates them) with forced times in ARGV[1] and checks one property the
algorithms promise (tests/model/ALGORITHMS.md): the fixed-window edge burst,
sliding-log exactness at the window edge, the sliding-counter approximation
error against an exact log, token refill at fractional rates, GCRA
retry_after to the millisecond, leaky-bucket order and spacing of delays,
all-or-nothing charging, key expiry, memory bounds, and quota changes on
reload keeping everyone's count.
"""
import math
import os
import random
import sys
import time
from fractions import Fraction

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "model"))
import limits_script  # noqa: E402
import models  # noqa: E402

T0 = 1_700_000_000_000_000            # us, on a 1 h boundary
S = 1_000_000                         # one second in us
MS = 1_000


class Reply:
    def __init__(self, raw):
        self.allowed, self.now_ms = raw[0] == 1, raw[1]
        self.limits = [dict(zip(("allowed", "remaining", "reset", "retry", "delay"),
                                raw[2 + 5 * i:7 + 5 * i])) for i in range((len(raw) - 2) // 5)]

    def __getitem__(self, i):
        return self.limits[i]


@pytest.fixture
def lim(redis_server):
    L = limits_script.Limits(redis_server.client())

    def call(keys, limits, t, cost=1):
        if isinstance(keys, str):
            keys, limits = [keys], [limits]
        return Reply(L.call(keys, limits, t, cost))
    call.r = L.r

    def in_one_transaction(key, spec, t, n):
        """n checks of key, one call each, in one MULTI/EXEC: back to
        back, and with Redis's lazy expiry frozen meanwhile."""
        pipe = L.r.pipeline(transaction=True)
        for _ in range(n):
            pipe.evalsha(L.sha, 1, key, *L.args(t, 1, [spec]))
        return [Reply([int(x) for x in raw]) for raw in pipe.execute()]
    call.in_one_transaction = in_one_transaction
    return call


def test_script_order_matches_makefile():
    order = limits_script.makefile_algorithms()
    if order is None:
        pytest.skip("no Makefile with ALGORITHMS yet; the tests build the script themselves")
    assert order == limits_script.ALGORITHMS


def test_real_clock_and_expiry(lim):
    """ARGV[1] = "0" (what the daemon sends) reads Redis TIME, and every
    algorithm's key expires on the real clock once its state stops
    mattering, after which the client is fresh."""
    limits = {
        "fixed_window": ("fixed_window", 2, 300 * MS, 0),
        "sliding_window_log": ("sliding_window_log", 2, 300 * MS, 0),
        "sliding_window_counter": ("sliding_window_counter", 2, 300 * MS, 100 * MS),
        "token_bucket": ("token_bucket", 2, 10, S),
        "leaky_bucket": ("leaky_bucket", 2, 10, S),
        "gcra": ("gcra", 2, 10, S),
    }
    for alg, spec in limits.items():
        if alg == "fixed_window":
            # Its windows are aligned to Redis's clock: a pair of calls
            # that straddled a 300 ms boundary saw the second admitted by
            # a fresh window (a CI run did). Start early in one.
            while True:
                secs, micros = lim.r.time()
                if (secs * 1000 + micros // 1000) % 300 < 100:
                    break
                time.sleep(0.005)
        before = int(time.time() * 1000)
        rep = lim("rc:" + alg, spec, 0, cost=2)
        after = int(time.time() * 1000)
        assert rep.allowed and rep[0]["remaining"] == 0
        assert before - 5 <= rep.now_ms <= after + 5
        pttl = lim.r.pttl("rc:" + alg)
        assert 0 < pttl <= rep[0]["reset"] + 1 <= 401, alg
        assert not lim("rc:" + alg, spec, 0).allowed
    time.sleep(0.45)
    for alg, spec in limits.items():
        assert lim.r.exists("rc:" + alg) == 0, alg
        rep = lim("rc:" + alg, spec, 0, cost=2)
        assert rep.allowed, alg


def test_fixed_window_edge_burst(lim):
    """Up to 2x the limit across a boundary: limit requests in the last
    microsecond of a window and limit more in the first of the next."""
    spec = ("fixed_window", 5, S, 0)
    edge = T0 + 7 * S
    # The window's key expires 2 ms after its first charge on the real
    # clock (1 us of the window is left at the forced time): one call after
    # another took longer than that once in CI, and the sixth found a new
    # window. In one transaction they run back to back.
    reps = lim.in_one_transaction("fw", spec, edge - 1, 6)
    for i, rep in enumerate(reps[:5]):
        assert rep.allowed and rep[0]["remaining"] == 4 - i and rep[0]["reset"] == 1
    rep = reps[5]
    assert not rep.allowed and rep[0]["retry"] == 1          # 1 us, rounded up to 1 ms
    for i in range(5):
        assert lim("fw", spec, edge).allowed                 # 10 within 2 us
    rep = lim("fw", spec, edge)
    assert not rep.allowed and rep[0]["retry"] == 1000 and rep[0]["reset"] == 1000
    assert not lim("fw", spec, edge + S - 1).allowed
    assert lim("fw", spec, edge + S).allowed


def test_fixed_window_sets_expiry_once_per_window_and_length(lim):
    """A window's first charge sets the key's expiry (its end, plus 1 ms);
    later charges of that window leave it alone (PERSIST shows they do).
    A charge under another window length that starts at the same instant
    (a reload from 10 s to 20 s at a 20 s boundary) keeps the count and
    sets the expiry for the longer window; so does a charge on a hash left
    by a build that did not record the length."""
    def ttl_near(key, ms):
        got = lim.r.pttl(key)
        assert ms - 100 <= got <= ms, (key, got, ms)

    ten, twenty = ("fixed_window", 5, 10 * S, 0), ("fixed_window", 5, 20 * S, 0)
    start = T0 // (20 * S) * (20 * S)
    assert start // (10 * S) * (10 * S) == start
    rep = lim("fw-ttl", ten, start + S)
    assert rep.allowed and rep[0]["remaining"] == 4
    ttl_near("fw-ttl", 9_001)
    lim.r.persist("fw-ttl")
    rep = lim("fw-ttl", ten, start + 2 * S)
    assert rep.allowed and rep[0]["remaining"] == 3
    assert lim.r.pttl("fw-ttl") == -1                      # left alone
    rep = lim("fw-ttl", twenty, start + 3 * S)
    assert rep.allowed and rep[0]["remaining"] == 2 and rep[0]["reset"] == 17_000
    ttl_near("fw-ttl", 17_001)
    lim.r.persist("fw-ttl")
    assert lim("fw-ttl", twenty, start + 4 * S).allowed
    assert lim.r.pttl("fw-ttl") == -1
    # the next window's first charge sets it again
    rep = lim("fw-ttl", twenty, start + 20 * S)
    assert rep.allowed and rep[0]["remaining"] == 4
    ttl_near("fw-ttl", 20_001)

    lim.r.hset("fw-old", mapping={"s": str(start), "n": "3"})
    rep = lim("fw-old", ten, start + 5 * S)
    assert rep.allowed and rep[0]["remaining"] == 1
    ttl_near("fw-old", 5_001)
    assert lim.r.hgetall("fw-old") == {b"s": str(start).encode(), b"n": b"4",
                                       b"w": str(10 * S).encode()}


def test_sliding_log_exact_at_window_edge(lim):
    """No more than limit in any window (now - W, now]: an entry at t0
    counts until t0 + W - 1 and is out at t0 + W, to the microsecond."""
    W = 10 * S
    spec = ("sliding_window_log", 3, W, 0)
    t0 = T0 + 123_457
    for k in range(3):
        rep = lim("swl", spec, t0 + k * S)
        assert rep.allowed and rep[0]["remaining"] == 2 - k and rep[0]["reset"] == 10_000
    rep = lim("swl", spec, t0 + W - 1)
    assert not rep.allowed
    assert rep[0]["retry"] == 1                # t0 leaves at t0 + W: 1 us away
    assert rep[0]["reset"] == 2_001            # the newest (t0 + 2 s) leaves 2 s + 1 us later
    rep = lim("swl", spec, t0 + W)
    assert rep.allowed and rep[0]["remaining"] == 0
    # cost 2 needs the two oldest gone: t0 + 1 s and t0 + 2 s leave at +11 s, +12 s
    rep = lim("swl", spec, t0 + W + 500 * MS, cost=2)
    assert not rep.allowed and rep[0]["retry"] == 1_500 and rep[0]["remaining"] == 0
    assert not lim("swl", spec, t0 + 12 * S - 1, cost=2).allowed
    assert lim("swl", spec, t0 + 12 * S, cost=2).allowed
    # same microsecond, cost > 1: every unit is its own member
    assert lim.r.zcard("swl") == 3
    assert lim("swl2", spec, t0, cost=2).allowed and lim("swl2", spec, t0).allowed
    assert lim.r.zcard("swl2") == 3 and not lim("swl2", spec, t0).allowed


def oldest_bucket(times, t, W, P):
    """(n_o, f): requests in the oldest, partly-inside bucket at t and the
    fraction of that bucket inside (t - W, t]."""
    o = (t - W) // P * P
    n_o = sum(1 for x in times if o <= x < o + P)
    return n_o, Fraction(o + P - (t - W), P)


def test_sliding_counter_error_bounded_against_exact_log(lim):
    """The counter assumes the requests of the oldest bucket (the one the
    window edge cuts) were spread evenly over it. The other buckets are
    exact, so if n_o requests fell in that bucket and a fraction f of it
    lies inside the window, the counter says n_o*f where the truth is some
    x in [0, n_o]:
        |counter - exact| <= n_o * max(f, 1 - f) <= n_o.
    Measured here on one route with both limits (huge limits, so that both
    count the same requests), at random and at boundary times."""
    W, P, L = 10 * S, S, 1_000_000
    specs = [("sliding_window_counter", L, W, P), ("sliding_window_log", L, W, 0)]
    keys = ["{e}:c", "{e}:l"]
    rng = random.Random(7)
    t, times, worst, worst_ratio = T0 + 3 * S, [], 0, Fraction(0)
    for i in range(1500):
        # bursts and gaps, so buckets are uneven
        t += rng.choice([0, 0, 1, rng.randint(1, 50 * MS), rng.randint(1, 2 * S),
                         (t // P + 1) * P - t, (t // P + 1) * P - t - 1])
        rep = lim(keys, specs, t)
        assert rep.allowed
        times.append(t)
        exact = L - rep[1]["remaining"]
        # remaining = floor(L - approx): approx in [L - rem - 1, L - rem]
        hi = L - rep[0]["remaining"]
        n_o, f = oldest_bucket(times, t, W, P)
        bound = n_o * max(f, 1 - f)
        assert exact - bound <= hi and hi - 1 <= exact + bound, (i, exact, hi, n_o, f)
        err = abs(hi - exact)
        worst = max(worst, err)
        if n_o:
            worst_ratio = max(worst_ratio, Fraction(max(0, err - 1), n_o))
    assert 0 < worst and worst_ratio <= 1
    print("sliding_window_counter: worst |counter - exact| = %d requests" % worst)


def test_sliding_counter_admits_at_most_limit_plus_edge_bucket(lim):
    """What the error means for admission: when a request is admitted,
    counter + cost <= limit, so the exact count then is at most
    limit + n_o * (1 - f) < limit + n_o. Under overload at 3x the limit,
    spread evenly (n_o ~ limit * P / W), no window ever holds more than
    limit * (1 + P/W) + 1; with everything sent at one bucket's end (the
    worst case) a window can hold up to 2 x limit - 1."""
    W, P, L = 10 * S, S, 100
    spec = ("sliding_window_counter", L, W, P)
    admitted, t = [], T0 + 5 * S + 1
    for i in range(3 * L * 6):                     # 60 s at 30/s
        t += W // (3 * L)
        rep = lim("swc", spec, t)
        if rep.allowed:
            admitted.append(t)
            n_o, f = oldest_bucket(admitted[:-1], t, W, P)
            exact = sum(1 for x in admitted if x > t - W)
            assert exact <= L + n_o * (1 - f)
    worst = max(sum(1 for x in admitted if t - W < x <= t) for t in admitted)
    assert L <= worst <= L + L * P // W + 1
    # adversarial: L at the last microsecond of a bucket, then L more as soon
    # as that bucket is almost out of the counter's window
    edge = T0 + 20 * S - 1
    rep = lim("swc2", spec, edge, cost=L)
    assert rep.allowed
    later = edge + W - 2                       # the L requests are still inside
    rep = lim("swc2", spec, later, cost=L - 1)
    assert rep.allowed                         # the counter weighs that bucket 3/1e6
    assert not lim("swc2", spec, later).allowed


def test_sliding_counter_retry_exact_and_stale_buckets_removed(lim):
    W, P = 3 * S, S
    spec = ("sliding_window_counter", 4, W, P)
    t0 = T0 + 10 * S
    rep = lim("swc", spec, t0 + 250 * MS, cost=4)          # bucket [t0, t0+1s)
    assert rep.allowed
    # at t0 + 3.25 s the bucket is the oldest with 3/4 inside: count 3
    rep = lim("swc", spec, t0 + 3 * S + 250 * MS)
    assert rep.allowed and rep[0]["remaining"] == 0       # 3 + 1 = 4
    # count = 4 * (t0 + 4 s - t)/1 s + 1; passes when <= 3: t >= t0 + 3.5 s
    rep = lim("swc", spec, t0 + 3 * S + 250 * MS)
    assert not rep.allowed and rep[0]["retry"] == 250
    assert not lim("swc", spec, t0 + 3 * S + 500 * MS - 1).allowed
    assert lim("swc", spec, t0 + 3 * S + 500 * MS).allowed
    assert lim.r.hlen("swc") == 2
    # much later every old bucket is deleted, only the new one stays
    assert lim("swc", spec, t0 + 60 * S).allowed
    assert lim.r.hlen("swc") == 1


def test_token_refill_at_fractional_rates(lim):
    """5/10s: one token every 2 s, exactly; 3/s: one every 333333.33 us,
    with no drift over thousands of requests."""
    spec = ("token_bucket", 5, 5, 10 * S)
    t0 = T0 + 17
    for k in range(5):
        assert lim("tb", spec, t0)[0]["remaining"] == 4 - k
    rep = lim("tb", spec, t0)
    assert not rep.allowed and rep[0]["retry"] == 2_000 and rep[0]["reset"] == 10_000
    assert not lim("tb", spec, t0 + 2 * S - 1).allowed
    rep = lim("tb", spec, t0 + 2 * S)
    assert rep.allowed and rep[0]["remaining"] == 0 and rep[0]["reset"] == 10_000
    rep = lim("tb", spec, t0 + 3 * S)                       # 0.5 token
    assert not rep.allowed and rep[0]["retry"] == 1_000 and rep[0]["reset"] == 9_000
    rep = lim("tb", spec, t0 + 7 * S)                       # 2.5 tokens
    assert rep.allowed and rep[0]["remaining"] == 1 and rep[0]["reset"] == 7_000
    rep = lim("tb", spec, t0 + 7 * S, cost=2)               # 1.5 left, cost 2
    assert not rep.allowed and rep[0]["retry"] == 1_000
    # 3/s, burst 2, emptied at t0: a request at every ceil(k * 1e6 / 3) us
    # passes, one a microsecond earlier does not, for 3000 requests (1000 s)
    for alg in ("token_bucket", "gcra", "leaky_bucket"):
        spec = (alg, 2, 3, S)
        assert lim("tb3" + alg, spec, t0, cost=2).allowed
        for k in range(1, 3001):
            tk = t0 + -(-k * S // 3)
            assert not lim("tb3" + alg, spec, tk - 1).allowed, (alg, k)
            assert lim("tb3" + alg, spec, tk).allowed, (alg, k)


def test_gcra_burst_and_retry_to_the_millisecond(lim):
    """A fresh client gets exactly `burst` at once (redis-cell's max_burst =
    B admits B + 1); retry_after is the exact wait rounded up to the ms."""
    spec = ("gcra", 5, 3, S)                     # T = 333333.33 us
    t0 = T0 + 999
    for k in range(5):
        rep = lim("g", spec, t0)
        assert rep.allowed and rep[0]["remaining"] == 4 - k
        assert rep[0]["reset"] == math.ceil((k + 1) * S / 3 / 1000)
    rep = lim("g", spec, t0)
    assert not rep.allowed and rep[0]["retry"] == 334 and rep[0]["reset"] == 1667
    assert not lim("g", spec, t0 + 333_333).allowed
    rep = lim("g", spec, t0 + 500)
    assert rep[0]["retry"] == 333                # 332833.33 us
    rep = lim("g", spec, t0 + 333_334)
    assert rep.allowed and rep[0]["remaining"] == 0
    # cost 3 needs 3 emission intervals of room: from TAT = t0 + 2 s,
    # passes when TAT + 1 s - t <= 5/3 s, i.e. at t0 + 1333333.33 us
    rep = lim("g", spec, t0 + 400_000, cost=3)
    assert not rep.allowed and rep[0]["retry"] == 934   # 933333.33 us
    assert not lim("g", spec, t0 + 1_333_333, cost=3).allowed
    assert lim("g", spec, t0 + 1_333_334, cost=3).allowed
    # state is one string key with the exact TAT: t0 + 3 s
    assert lim.r.type("g") == b"string" and lim.r.get("g") == str(t0 + 3 * S).encode()


def test_leaky_bucket_order_and_spacing_of_delays(lim):
    """A fresh client gets exactly burst at once, the k-th delayed (k-1)/rate;
    every admitted request is served (now + delay) in arrival order, one
    emission interval per unit of cost after the one before when the queue
    is busy, and no delay reaches burst/rate."""
    spec = ("leaky_bucket", 5, 10, S)            # 100 ms per request
    t0 = T0
    delays = [lim("lb", spec, t0)[0]["delay"] for _ in range(5)]
    assert delays == [0, 100, 200, 300, 400]
    rep = lim("lb", spec, t0)
    assert not rep.allowed and rep[0]["retry"] == 100 and rep[0]["delay"] == 0
    assert rep[0]["reset"] == 500
    rep = lim("lb", spec, t0 + 100 * MS)
    assert rep.allowed and rep[0]["delay"] == 400 and rep[0]["remaining"] == 0
    # random arrivals in whole ms (delays are then exact in ms)
    rng = random.Random(3)
    t, last_end, served, cap_ms = t0 + 10 * S, None, 0, 5 * 100
    for i in range(2000):
        t += rng.choice([0, 0, 10, 50, 100, 150, 400]) * MS
        cost = rng.choice([1, 1, 2])
        rep = lim("lb2", spec, t, cost)
        if not rep.allowed:
            continue
        d = rep[0]["delay"]
        start = t // MS + d
        assert d < cap_ms
        if last_end is not None:
            assert start >= last_end                   # FIFO, never overlapping
            if d > 0:
                assert start == last_end               # busy queue: back to back
        last_end = start + cost * 100
        served += 1
    assert served > 500


def test_all_or_nothing(lim):
    """A request denied by one limit charges none: the other limits of the
    route report what was left before, and are unchanged afterwards."""
    specs = [("gcra", 10, 10, S), ("sliding_window_log", 2, 60 * S, 0),
             ("token_bucket", 10, 1, S), ("leaky_bucket", 10, 10, S),
             ("sliding_window_counter", 10, 60 * S, 6 * S), ("fixed_window", 10, 60 * S, 0)]
    keys = ["{a}:%d" % i for i in range(len(specs))]
    t = T0 + 5
    assert lim(keys, specs, t).allowed and lim(keys, specs, t).allowed
    dump = {k: lim.r.dump(k) for k in keys}
    rep = lim(keys, specs, t)
    assert not rep.allowed
    assert [l["allowed"] for l in rep.limits] == [1, 0, 1, 1, 1, 1]
    assert [l["remaining"] for l in rep.limits] == [8, 0, 8, 8, 8, 8]
    assert [l["delay"] for l in rep.limits] == [0] * 6
    assert {k: lim.r.dump(k) for k in keys} == dump
    # a cost above one limit's quota never passes, and charges nothing either
    rep = lim(keys[:1] + keys[2:], specs[:1] + specs[2:], t, cost=11)
    assert not rep.allowed and all(l["retry"] > 0 for l in rep.limits)
    assert {k: lim.r.dump(k) for k in keys} == dump


def test_memory_bounded_per_client(lim):
    """sliding_window_log: at most limit members; sliding_window_counter: at
    most window/precision + 1 fields however long it runs; the others one
    small key whose size does not grow with traffic."""
    rng = random.Random(11)
    specs = {
        "fixed_window": ("fixed_window", 50, S, 0),
        "token_bucket": ("token_bucket", 50, 50, S),
        "leaky_bucket": ("leaky_bucket", 50, 50, S),
        "gcra": ("gcra", 50, 50, S),
        "sliding_window_log": ("sliding_window_log", 50, S, 0),
        "sliding_window_counter": ("sliding_window_counter", 50, S, 100 * MS),
    }
    for alg, spec in specs.items():
        t, sizes = T0 + 1, []
        for i in range(3000):
            t += rng.randint(0, 40 * MS)
            lim("mem", spec, t)
            if alg == "sliding_window_log":
                assert lim.r.zcard("mem") <= 50
            elif alg == "sliding_window_counter":
                assert lim.r.hlen("mem") <= 11
            if i in (100, 2999):
                sizes.append(lim.r.memory_usage("mem", samples=0))
        if alg == "sliding_window_log":
            assert sizes[-1] <= 50 * 40 + 200, (alg, sizes)
        elif alg == "sliding_window_counter":
            assert sizes[-1] <= 11 * 40 + 200, (alg, sizes)
        else:
            assert sizes[-1] <= 200 and abs(sizes[-1] - sizes[0]) <= 16, (alg, sizes)
        lim.r.delete("mem")


@pytest.mark.parametrize("alg", limits_script.ALGORITHMS)
def test_raised_quota_keeps_count(lim, alg):
    """The key names the limit and algorithm, never the numbers: a reload
    that raises the quota (same key, bigger argument) takes effect at once
    and keeps everyone's count: 3 used of 4, then of 10, leaves 7."""
    small = {"fixed_window": (4, 60 * S, 0), "sliding_window_log": (4, 60 * S, 0),
             "sliding_window_counter": (4, 60 * S, 6 * S)}.get(alg, (4, 1, 60 * S))
    big = (10,) + small[1:]
    t = T0 + 1
    for _ in range(3):
        assert lim("q", (alg,) + small, t).allowed
    rep = lim("q", (alg,) + big, t + 1)
    assert rep.allowed and rep[0]["remaining"] == 6
    for i in range(6):
        assert lim("q", (alg,) + big, t + 2).allowed
    assert not lim("q", (alg,) + big, t + 2).allowed


def test_fixed_window_carries_a_count_begun_inside_the_new_window(lim):
    """2 s to 3 s on reload: a 2 s window that began inside the current
    3 s one holds only requests of that 3 s window, so its count is
    carried (it was dropped, because the 2 s window ends after the 3 s
    one: 10 admitted in one 3 s window of 5). One that began before the
    3 s window is not carried."""
    two, three = ("fixed_window", 5, 2 * S, 0), ("fixed_window", 5, 3 * S, 0)
    base = T0 // (6 * S) * (6 * S)               # a 2 s and a 3 s window start here
    for _ in range(5):
        assert lim("fw-23", two, base + 2 * S + 50 * MS).allowed     # window [2, 4)
    rep = lim("fw-23", three, base + 2 * S + 70 * MS)               # window [0, 3)
    assert not rep.allowed and rep[0]["remaining"] == 0, rep.limits
    assert rep[0]["reset"] == 930 and rep[0]["retry"] == 930
    assert 800 <= lim.r.pttl("fw-23") <= 931          # the 3 s window's end
    assert lim("fw-23", three, base + 3 * S).allowed                 # the next one
    # both windows starting at one instant, 10 s to 20 s: a denial sets
    # the 20 s window's expiry (the 10 s one's took the count at 10 s,
    # and the client got 3 more in the same 20 s window of 3)
    ten, twenty = ("fixed_window", 3, 10 * S, 0), ("fixed_window", 3, 20 * S, 0)
    base20 = T0 // (20 * S) * (20 * S)
    for _ in range(3):
        assert lim("fw-1020", ten, base20 + 500 * MS).allowed
    assert 9_000 <= lim.r.pttl("fw-1020") <= 9_501
    assert not lim("fw-1020", twenty, base20 + 600 * MS).allowed
    assert 19_000 <= lim.r.pttl("fw-1020") <= 19_401
    assert not lim("fw-1020", twenty, base20 + 11 * S).allowed
    # begun before the new window: [0, 2) holds requests before 1 s
    for _ in range(5):
        assert lim("fw-23b", two, base + 4 * S + 100 * MS).allowed  # window [4, 6)
    assert lim("fw-23b", three, base + 6 * S + 10 * MS).allowed     # [6, 9): fresh


def test_fixed_window_housekeeping_refused_under_oom_still_denies(lim):
    """A window hash without its length (an older build's) is rewritten
    during the check; under maxmemory Redis refuses that first write, and
    the client over its limit was answered by the failure mode (200 by
    default) instead of denied."""
    spec = ("fixed_window", 5, 10 * S, 0)
    start = T0 // (10 * S) * (10 * S)
    lim.r.hset("fw-oom", mapping={"s": str(start), "n": "5"})
    lim.r.set("fw-oom-filler", "x" * 1000)
    lim.r.config_set("maxmemory-policy", "noeviction")
    lim.r.config_set("maxmemory", "1")
    try:
        for _ in range(2):
            rep = lim("fw-oom", spec, start + S)
            assert not rep.allowed and rep[0]["remaining"] == 0, rep.limits
    finally:
        lim.r.config_set("maxmemory", "0")
    assert lim.r.hget("fw-oom", "w") is None          # refused, and told nothing


@pytest.mark.parametrize("alg,before,after,reset_ms", [
    # a slower refill: 10 tokens short at 1/s take 10 s, not 1 s
    ("token_bucket", (10, 10, S), (10, 1, S), 10_000),
    # a longer window: the entries of the last second count for a minute
    ("sliding_window_log", (10, S, 0), (10, 60 * S, 0), 60_000),
    ("sliding_window_counter", (10, S, 100 * MS), (10, 60 * S, 6 * S), 60_000),
])
def test_a_denial_keeps_the_state_for_the_new_numbers(lim, alg, before, after, reset_ms):
    """A reload that slows a refill or lengthens a window: the key was
    written with the old numbers' expiry, and a denied check wrote
    nothing, so the key went on the old schedule and the client came
    back with a full quota (10 of 10 admitted 1.5 s later where the new
    numbers allow 1 or 0). A denial sets the expiry again from the new
    numbers."""
    key = "hold-" + alg
    t = T0 + 7
    for _ in range(10):
        assert lim(key, (alg,) + before, t).allowed
    assert lim.r.pttl(key) <= 1101              # a second (and a bucket)
    rep = lim(key, (alg,) + after, t + 10 * MS)
    assert not rep.allowed
    assert rep[0]["reset"] >= reset_ms - 100, rep.limits
    assert rep[0]["reset"] - 50 <= lim.r.pttl(key) <= rep[0]["reset"] + 1


def test_rate_change_converts_exact_state_conservatively(lim):
    """A stored TAT or token count with another rate's denominator is
    rounded towards less quota, never more."""
    t0 = T0 + 3
    for alg in ("gcra", "leaky_bucket"):
        assert lim("rcv" + alg, (alg, 3, 3, S), t0, cost=2).allowed   # TAT t0 + 666666.67 us
        rep = lim("rcv" + alg, (alg, 7, 10, S), t0)                   # 10/s: 100 ms each
        assert not rep.allowed and rep[0]["retry"] == 67              # 66666.67 us
        assert rep[0]["reset"] == 667 and rep[0]["remaining"] == 0
    # token bucket 3 at 7/3s: a deficit of 2 5/6 tokens, stored in 1/3e6
    # token units; at 1/s that is rounded up to 2833334 us of refill
    spec = ("token_bucket", 3, 7, 3 * S)
    assert lim("rcvtb", spec, t0, cost=3).allowed
    assert lim("rcvtb", spec, t0 + 500 * MS).allowed           # 1 1/6 tokens there
    assert lim.r.hget("rcvtb", "d") == b"2+2500000/3000000"
    rep = lim("rcvtb", ("token_bucket", 3, 1, S), t0 + 500 * MS)
    assert not rep.allowed and rep[0]["retry"] == 834 and rep[0]["reset"] == 2834


def test_raised_rate_owes_at_most_a_full_meter(lim):
    """A gcra or leaky_bucket stores a time, so a rate raised on reload
    reads it as more requests owed than the burst: 3 at 1/h is 3 h, which
    at 10/s is 108,000 requests, and locked the client out for 3 h
    (retry 10,799,800 ms). A client owes at most a full meter at the new
    numbers: the next request one emission interval from now."""
    t0 = T0 + 7
    for alg in ("gcra", "leaky_bucket"):
        key = "raise" + alg
        assert lim(key, (alg, 3, 1, 3600 * S), t0, cost=3).allowed
        assert lim(key, (alg, 3, 1, 3600 * S), t0 + S)[0]["retry"] == 3599 * S // MS
        fast = (alg, 3, 10, S)
        rep = lim(key, fast, t0 + S)
        assert not rep.allowed and rep[0]["retry"] == 100 and rep[0]["reset"] == 300, alg
        assert rep[0]["remaining"] == 0
        assert not lim(key, fast, t0 + S + 100 * MS - 1).allowed
        assert lim(key, fast, t0 + S + 100 * MS).allowed, alg
        # a burst lowered likewise: 3 at 10/s owes 300 ms, at most 100 ms
        # at a burst of 1
        assert lim(key + "b", fast, t0, cost=3).allowed
        rep = lim(key + "b", (alg, 1, 10, S), t0)
        assert not rep.allowed and rep[0]["retry"] == 100 and rep[0]["reset"] == 100


def test_lowered_burst_reads_at_most_an_empty_bucket(lim):
    """A token_bucket stores the tokens missing, so a burst lowered on reload
    from 1000 to 10 left a client that had spent 1000 owing 990 more than
    the bucket holds: 991 s for a token it would have had in 1 s under
    either number. These numbers now read at most an empty bucket,
    refilling since the last charge, while the deficit stored stays whole:
    a sidecar still on the old numbers (a fleet rolling the change out)
    goes on counting every request against its 1000."""
    t0 = T0 + 9
    big, small = ("token_bucket", 1000, 1, S), ("token_bucket", 10, 1, S)
    assert lim("lowtb", big, t0, cost=1000).allowed
    rep = lim("lowtb", small, t0 + 500 * MS)
    # full again once the 999.5 owed have refilled
    assert not rep.allowed and rep[0]["retry"] == 500 and rep[0]["reset"] == 999500
    assert rep[0]["remaining"] == 0
    assert lim.r.hget("lowtb", "d") == b"1000"          # a denial writes no count
    assert 999500 <= lim.r.pttl("lowtb") <= 999502      # nor shortens its life
    assert not lim("lowtb", small, t0 + S - 1).allowed
    rep = lim("lowtb", small, t0 + S)
    assert rep.allowed and rep[0]["remaining"] == 0
    assert lim.r.hget("lowtb", "d") == b"1000"          # 999 owed, 1 charged
    # one a second, as the new numbers say; the old ones still see 1000 owed
    assert not lim("lowtb", small, t0 + 2 * S - 1).allowed
    assert not lim("lowtb", big, t0 + 2 * S - 1).allowed
    assert lim("lowtb", small, t0 + 2 * S).allowed
    # idle 10 s: the new bucket reads full, but 990 are still owed, so an
    # admission leaves it empty, and the reply says what the next check finds
    rep = lim("lowtb", small, t0 + 12 * S)
    assert rep.allowed and rep[0]["remaining"] == 0 and rep[0]["reset"] == 991000
    assert not lim("lowtb", small, t0 + 12 * S).allowed
    # refilled by 10 but still owing: denied by another limit of the
    # route, it says the one admission it has left, not 10 (a review)
    fw = ("fixed_window", 1, 3600 * S, 0)
    assert lim("lowfw", fw, t0 + 30 * S).allowed
    rep = lim(["lowtb", "lowfw"], [small, fw], t0 + 30 * S)
    assert not rep.allowed and rep[0]["allowed"] and rep[0]["remaining"] == 1, rep.limits
    assert [lim("lowtb", small, t0 + 30 * S).allowed for _ in range(3)] == [True, False, False]
    # owed less than the burst: the bucket is exact again
    t1 = t0 + 30 * S + 974 * S             # the 974 owed have refilled
    rep = lim("lowtb", small, t1)
    assert rep.allowed and rep[0]["remaining"] == 9, rep[0]
    rep = lim("lowtb", small, t1)
    assert rep.allowed and rep[0]["remaining"] == 8, rep[0]


def test_clock_going_back_grants_nothing(lim):
    """If Redis's clock steps back (a failover), no algorithm but the fixed
    window (whose earlier window is a different counter) admits more."""
    for alg, spec in (("sliding_window_log", ("sliding_window_log", 3, 10 * S, 0)),
                      ("sliding_window_counter", ("sliding_window_counter", 3, 10 * S, S)),
                      ("token_bucket", ("token_bucket", 3, 1, 10 * S)),
                      ("leaky_bucket", ("leaky_bucket", 3, 1, 10 * S)),
                      ("gcra", ("gcra", 3, 1, 10 * S))):
        t = T0 + 50 * S
        assert lim("back" + alg, spec, t, cost=3).allowed
        for back in (1, S, 5 * S, 30 * S):
            rep = lim("back" + alg, spec, t - back)
            assert not rep.allowed and rep[0]["retry"] > 0, (alg, back)


def test_clock_back_and_forward_again_gives_back_at_most_the_step(lim):
    """A gcra or leaky_bucket meter read past its cap is stored capped (a
    reload that raised the rate leaves one), and a Redis clock stepped
    back reads the same: when it steps forward again the client has the
    step back, X of meter (X * rate requests), at most its burst, where the
    meter left alone would have kept it out for X longer (a review)."""
    for alg in ("gcra", "leaky_bucket"):
        spec, t = (alg, 3, 1, 10 * S), T0 + 70 * S
        key = "clk" + alg
        assert lim(key, spec, t, cost=3).allowed                # full: t + 30 s
        assert not lim(key, spec, t - 5 * S).allowed            # capped: t + 25 s
        rep = lim(key, spec, t)
        assert not rep.allowed and rep[0]["retry"] == 5000, (alg, rep[0])
        key += "2"
        assert lim(key, spec, t, cost=3).allowed
        assert not lim(key, spec, t - 40 * S).allowed           # capped: t - 10 s
        assert [lim(key, spec, t).allowed for _ in range(4)] == [True] * 3 + [False]


def test_model_agrees_on_these_boundaries():
    """The reference model, independently, on the GCRA / leaky numbers used
    above (the randomized suite compares it with the script everywhere)."""
    g = models.make(("gcra", 5, 3, S))
    for _ in range(5):
        models.route_call([g], T0, 1)
    reply, ds = models.route_call([g], T0, 1)
    assert reply[2:] == [0, 0, 1667, 334, 0]
    lb = models.make(("leaky_bucket", 5, 10, S))
    assert [models.route_call([lb], T0, 1)[0][6] for _ in range(6)] == [0, 100, 200, 300, 400, 0]
