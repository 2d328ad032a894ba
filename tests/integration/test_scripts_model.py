"""The limits script on a real Redis against the reference models.

Random sequences of (time, cost) drive the real script (built from
scripts/*.lua exactly as `make` builds build/limits.lua) on a real
redis-server, and the same sequences drive the plain-Python models of
tests/model/models.py. Every reply field must agree: allowed, now_ms and,
per limit, allowed, remaining, reset_ms, retry_after_ms and delay_ms. Runs
cover each algorithm alone, every pair of algorithms on one route, and
random mixes of three. Times are forced through ARGV[1]; steps include 0,
exact window and emission-interval multiples, boundaries +-1 us, and jumps
to exactly (+-1 us) the microsecond the model says a denied request would
pass, or an admitted one's limits would be full again.

Each call runs the real script text inside a test wrapper script
(limits_script.build_probe_script) that plays the forced clock's expiry:
before the script it deletes the keys whose expiry has come at the forced
time and sets the others' to what is left of it; after, it reads every
key's expiry and PERSISTs it, so the real clock expires nothing between
calls. A key that expired too early would lose state that still matters,
and the next decision would differ from the model's. Every charge must set
its keys to expire exactly 1 ms after their state stops mattering (rounded
up to the millisecond; see expiry_ms in lib.lua), except a fixed window's
later charges, which must leave the expiry its window's first charge set;
a denied call must leave every expiry alone. (Only an expiry of 1-2 ms can
pass on the real clock inside the call; the harness then takes the key as
gone, as it is, and counts it; that must stay rare.)
"""
import itertools
import os
import random
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "model"))
import limits_script  # noqa: E402
import models  # noqa: E402

BASE = 1_700_000_000_000_000          # us; a realistic epoch time
RATES = [(1, 1_000_000), (3, 1_000_000), (5, 10_000_000), (7, 3_000_000),
         (10, 1_000_000), (2, 1_500_000), (100, 1_000_000), (6, 60_000_000)]
WINDOWS = [1_000, 1_000_000, 2_500_000, 10_000_000, 60_000_000]
PRECISIONS = [1_000, 100_000, 250_000, 1_000_000]
ALGS = limits_script.ALGORITHMS


def random_limit(rng, alg):
    if alg in ("fixed_window", "sliding_window_log"):
        return (alg, rng.randint(1, 8), rng.choice(WINDOWS), 0)
    if alg == "sliding_window_counter":
        p = rng.choice(PRECISIONS)
        return (alg, rng.randint(1, 10), rng.choice([1, 2, 3, 5, 10]) * p, p)
    n, period = rng.choice(RATES)
    return (alg, rng.randint(1, 6), n, period)


# algorithms whose expiry depends on their numbers (see hold_for_reset)
HELD_ON_DENIAL = ("token_bucket", "sliding_window_log", "sliding_window_counter")

class Harness:
    def __init__(self, r):
        self.r = r
        self.probe = r.script_load(limits_script.build_probe_script())
        self.calls = 0
        self.denied = 0          # calls denied (by at least one limit)
        self.split = 0           # calls denied by one limit while another allowed
        self.delayed = 0         # allowed calls with a delay
        self.lost = 0            # keys expired by the real clock (see run)
        self.slowest = 0         # ms, the longest script call seen

    def call(self, keys, limits, now, cost, expiry):
        """One probe call; expiry: per key, its expiry in ms at `now` on the
        forced clock (0: expired, -1: none; see build_probe_script)."""
        pipe = self.r.pipeline(transaction=False)
        pipe.evalsha(self.probe, len(keys), *keys,
                     *limits_script.Limits.args(now, cost, limits), *expiry)
        for k, lim in zip(keys, limits):
            if lim[0] == "sliding_window_log":
                pipe.zcard(k)
            elif lim[0] == "sliding_window_counter":
                pipe.hlen(k)
            else:
                pipe.exists(k)
        out = pipe.execute()
        self.calls += 1
        reply, ttls, elapsed = out[0]
        self.slowest = max(self.slowest, elapsed)
        ttls = [(int(ttls[i]), int(ttls[i + 1]), elapsed) for i in range(0, len(ttls), 2)]
        return [int(x) for x in reply], ttls, out[1:]

    def run(self, rng, limits, n_calls, tag):
        keys = ["rl:{m%s:c}:l%d:%s" % (tag, i, lim[0]) for i, lim in enumerate(limits)]
        ms = [models.make(lim) for lim in limits]
        us = sorted({u for lim in limits for u in models.units(lim) if u > 0})
        t = BASE + rng.randrange(0, 10 ** 9)
        if rng.random() < 0.3:
            t = t // us[-1] * us[-1]             # start on a boundary
        history = []
        probe = None
        deadline = [None] * len(limits)   # per key: its expiry, forced clock ms
        for i in range(n_calls):
            cost = rng.choice([1, 1, 1, 2, 3])
            now_ms = t // 1000
            expiry = [-1 if d is None else max(0, d - now_ms) for d in deadline]
            # a fixed window's later charges keep the expiry of its first
            window_goes_on = [lim[0] == "fixed_window" and m.count(t) > 0
                              for lim, m in zip(limits, ms)]
            expected, ds = models.route_call(ms, t, cost)
            got, ttls, sizes = self.call(keys, limits, t, cost, expiry)
            history.append((t - BASE, cost, got))
            ctx = "limits=%r call=%d t=BASE+%d cost=%d\nexpected %r\ngot      %r\nlast calls %r" % (
                limits, i, t - BASE, cost, expected, got, history[-8:])
            assert got == expected, ctx
            self.denied += not got[0]
            per_limit = {got[2 + 5 * j] for j in range(len(limits))}
            self.split += not got[0] and per_limit == {0, 1}
            self.delayed += got[0] and any(got[2 + 5 * j + 4] for j in range(len(limits)))
            for j, ((lo, hi, elapsed), lim) in enumerate(zip(ttls, limits)):
                where = "%s\nkey %d expiry in [%d, %d] ms" % (ctx, j, lo, hi)
                left_alone = lo > limits_script.PROBE_OFFSET_MS // 2
                # a denial sets a bucket's or a sliding window's expiry
                # again from the current numbers (a reload may have changed
                # them): reset_ms plus 1, as a charge does
                held = (not expected[0] and lim[0] in HELD_ON_DENIAL
                        and got[2 + 5 * j + 2] > 0)
                if (expected[0] and not window_goes_on[j]) or held:
                    # reset_ms after the charge, plus the 1 ms the scripts
                    # add (Redis's ms clock lags the script's TIME)
                    need = got[2 + 5 * j + 2] + 1
                    if lo == -2 and need <= elapsed + 2:
                        # A 1-2 ms expiry passed on the real clock between
                        # the script's PEXPIRE and the wrapper's read (Redis
                        # 7.0 expires on the real clock even inside a
                        # script): the key is gone, the state fresh again.
                        self.lost += 1
                        ms[j] = models.make(lim)
                        deadline[j] = None
                        continue
                    assert not left_alone and lo <= need <= hi, "%s, need %d" % (where, need)
                    deadline[j] = now_ms + need
                elif lo == -2:
                    # never written, expired (deleted by the wrapper), or
                    # emptied by housekeeping; a charged key must be there
                    assert not expected[0], "%s, charged key gone" % where
                    deadline[j] = None
                else:
                    # the expiry the wrapper set, left alone by the script
                    off = limits_script.PROBE_OFFSET_MS
                    assert left_alone and expiry[j] > 0 and \
                        lo - off <= expiry[j] <= hi - off, \
                        "%s, need %d + offset (left as it was)" % (where, expiry[j])
            for lim, size in zip(limits, sizes):
                if lim[0] == "sliding_window_log":
                    assert size <= lim[1], ctx           # O(limit) members
                elif lim[0] == "sliding_window_counter":
                    assert size <= lim[2] // lim[3] + 1, ctx   # O(window/precision)
            # Where the request would really pass: the max over the limits
            # that denied it (each only frees capacity as time passes).
            if not expected[0] and cost <= min(m.quota for m in ms):
                exact = max(d.retry_us for d in ds if not d.allowed)
                told = max(got[2 + 5 * j + 3] for j in range(len(limits))) * 1000
                assert told >= exact, ctx
                assert models.would_pass(ms, t + told, cost), ctx
                assert not models.would_pass(ms, t + exact - 1, cost), ctx
                probe = exact
            elif expected[0]:
                # sometimes jump to when the fullest limit is full again
                probe = max(models.first_true(lambda u, m=m: m.empty(t + u)) for m in ms) \
                    if rng.random() < 0.5 else None
            else:
                probe = None
            t += self.step(rng, t, us, probe)

    @staticmethod
    def step(rng, t, us, probe):
        x = rng.random()
        if probe is not None and x < 0.3:
            return max(0, probe + rng.choice([-1, 0, 0, 1]))
        if x < 0.4:
            return 0
        if x < 0.55:
            return rng.randint(1, max(1, us[0] // 3))
        if x < 0.7:
            return rng.randint(1, 3) * rng.choice(us)
        if x < 0.85:
            u = rng.choice(us)
            return max(0, (t // u + 1) * u - t + rng.choice([-1, 0, 1]))
        if x < 0.97:
            return rng.randint(1, 2 * us[-1])
        return rng.randint(2, 5) * us[-1]


def check_coverage(harness, calls):
    """The runs must have exercised both verdicts, and real-clock expiry
    (see Harness.run) must have touched only a few calls."""
    assert harness.calls == calls
    assert calls // 10 < harness.denied < calls * 9 // 10
    assert harness.lost <= calls // 100


@pytest.fixture
def harness(redis_server):
    return Harness(redis_server.client())


@pytest.mark.parametrize("alg", ALGS)
def test_each_algorithm_matches_model(harness, alg):
    rng = random.Random("single-" + alg)
    for s in range(40):
        harness.run(rng, [random_limit(rng, alg)], 80, "%s%d" % (alg, s))
    check_coverage(harness, 40 * 80)
    if alg == "leaky_bucket":
        assert harness.delayed > harness.calls // 10


def test_every_pair_matches_model(harness):
    """Every algorithm with every other (and with itself) on one route."""
    rng = random.Random("pairs")
    pairs = list(itertools.combinations_with_replacement(ALGS, 2))
    for s, (a, b) in enumerate(pairs):
        for rep in range(3):
            limits = [random_limit(rng, a), random_limit(rng, b)]
            harness.run(rng, limits, 50, "p%d-%d" % (s, rep))
    check_coverage(harness, len(pairs) * 3 * 50)
    assert harness.split > harness.calls // 10     # one limit denies, another allows
    assert harness.delayed > 0


def test_random_triples_match_model(harness):
    rng = random.Random("triples")
    for s in range(40):
        limits = [random_limit(rng, rng.choice(ALGS)) for _ in range(3)]
        harness.run(rng, limits, 50, "t%d" % s)
    check_coverage(harness, 40 * 50)
    assert harness.split > harness.calls // 10
