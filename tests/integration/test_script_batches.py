"""Batches of checks in one call of the limits script, on a real Redis.

The daemon sends the checks that arrive together as ONE EVALSHA (KEYS: every
check's limit keys in order; ARGV: forced time, the distinct limit sets of
the batch, each once, then per check its set and cost). The contract is that every check in a batch is
decided exactly as if it had been sent alone, in arrival order, at the same
instant: a later check sees what the earlier ones charged, and each check is
all-or-nothing over its own limits. This file proves it three ways:

  * Random batches (several seeds): a handful of routes of 1-3 limits that
    between them use all six algorithms, a few clients per route so the
    same keys come back several times within one batch, batch sizes 1..40,
    costs in {1, 1, 1, 2, 3}, at non-decreasing forced times (steps of 0
    included, so consecutive batches can share an instant). Every check's
    slice of the batched reply must equal, field by field, (a) the reference
    models of tests/model/models.py applied check by check (route_call) and
    (b) the same check sent through the real script alone, at the same
    forced time, on keys of another prefix. After each batch the state the
    batch wrote (content and expiry) must equal what the one-by-one calls
    wrote. The runs must show that the contract was really exercised:
    checks denied only because of an earlier check of the same batch,
    checks denied by one limit while another allowed, shaping delays, and
    batches sharing an instant.
  * Fixed examples with exact numbers: 60 checks on one fixed window of 50
    in one batch, and a 3-limit route where one limit (each algorithm in
    turn) denies and nothing is charged anywhere.
  * Malformed batches (wrong set or limit counts, more KEYS than limits,
    bad set indexes, costs or limit parameters, unknown algorithms, in the
    first set or check or a later one) answer a Redis error, never a reply, write nothing, and Redis
    stays up.

Expiry: the scripts PEXPIRE relative to the forced time, but Redis expires on
the real clock. Long-lived parameters (windows >= 1 s, refill times >= 1/3 s)
are not enough on their own: a fixed window's key expires at the end of the
window, which may be 2 ms after the forced instant. So every call runs in a
MULTI/EXEC with a PTTL read and a PERSIST of its keys (Redis freezes lazy
expiry inside EXEC; only PEXPIRE itself deletes a key whose deadline has
come on the real clock, which with the scripts' extra 1 ms takes a 1 ms
stall inside that one command). The scripts never rely on
expiry for correctness (test_scripts_model proves it), so persisting changes
no decision, and the PTTLs read are compared between the batch and the
one-by-one calls (to within the real time the calls took).
"""
import os
import random
import sys

import pytest
import redis

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "model"))
import limits_script  # noqa: E402
import models  # noqa: E402

BASE = 1_700_000_000_000_000          # us; a realistic epoch time, on a 10 s boundary
S = 1_000_000
MS = 1_000
ALGS = limits_script.ALGORITHMS
# State that lives well over the real duration of a test (see the docstring).
WINDOWS = [S, 2_500_000, 10 * S, 60 * S]
PRECISIONS = [100 * MS, 250 * MS, 500 * MS, S]
RATES = [(1, S), (3, S), (5, 10 * S), (2, 1_500_000)]
COSTS = [1, 1, 1, 2, 3]
FIELDS = ("allowed", "remaining", "reset_ms", "retry_after_ms", "delay_ms")


def random_limit(rng, alg):
    """A limit (algorithm, a, b, c) exactly as the daemon passes it."""
    if alg in ("fixed_window", "sliding_window_log"):
        return (alg, rng.randint(2, 8), rng.choice(WINDOWS), 0)
    if alg == "sliding_window_counter":
        p = rng.choice(PRECISIONS)
        k = rng.choice([k for k in (1, 2, 4, 5, 10, 20) if k * p >= S])
        return (alg, rng.randint(2, 8), k * p, p)
    n, period = rng.choice(RATES)
    return (alg, rng.randint(3, 8), n, period)


def random_routes(rng, count=5):
    """`count` routes of 1-3 limits; the six algorithms all appear."""
    sizes = [rng.randint(1, 3) for _ in range(count)]
    while sum(sizes) < len(ALGS):
        i = rng.randrange(count)
        sizes[i] = min(3, sizes[i] + 1)
    algs = list(ALGS) + [rng.choice(ALGS) for _ in range(sum(sizes) - len(ALGS))]
    rng.shuffle(algs)
    routes, i = [], 0
    for n in sizes:
        routes.append([random_limit(rng, a) for a in algs[i:i + n]])
        i += n
    return routes


def reply_fields(reply):
    """A check's reply as named fields, for assertion messages."""
    out = {"allowed": reply[0], "now_ms": reply[1]}
    for j in range((len(reply) - 2) // 5):
        for k, name in enumerate(FIELDS):
            out["limit%d.%s" % (j, name)] = reply[2 + 5 * j + k]
    return out


def field_diff(a, b):
    fa, fb = reply_fields(a), reply_fields(b)
    if len(a) != len(b):
        return "lengths %d != %d" % (len(a), len(b))
    return ", ".join("%s %r != %r" % (k, fa[k], fb[k]) for k in fa if fa[k] != fb[k])


class Script:
    """The real limits script (built as `make` builds build/limits.lua), run
    in MULTI/EXEC followed by PTTL and PERSIST of every key it was given
    (see the module docstring). Each call returns its reply, {key: PTTL} and
    the real milliseconds the transaction took (an upper bound on how long
    before the PTTL read each expiry was set)."""

    def __init__(self, r):
        self.r = r
        self.sha = limits_script.Limits(r).sha

    def _run(self, keys, argv):
        distinct = list(dict.fromkeys(keys))
        pipe = self.r.pipeline(transaction=True)
        pipe.time()
        pipe.evalsha(self.sha, len(keys), *keys, *argv)
        for k in distinct:
            pipe.pttl(k)
        pipe.time()
        for k in distinct:
            pipe.persist(k)
        out = pipe.execute()
        (s0, u0), (s1, u1) = out[0], out[2 + len(distinct)]
        elapsed_ms = -(-((s1 - s0) * S + (u1 - u0)) // MS)
        ttls = dict(zip(distinct, (int(x) for x in out[2:2 + len(distinct)])))
        return [int(x) for x in out[1]], ttls, elapsed_ms

    def batch(self, checks, now):
        """checks: [(keys, limits, cost)]; one reply slice per check, sliced
        as the daemon slices them (2 + 5 per limit)."""
        keys, argv = limits_script.Limits.batch_args(now, checks)
        flat, ttls, elapsed = self._run(keys, argv)
        out, i = [], 0
        for _, limits, _ in checks:
            out.append(flat[i:i + 2 + 5 * len(limits)])
            i += 2 + 5 * len(limits)
        assert i == len(flat), "batch reply has %d ints, expected %d" % (len(flat), i)
        return out, ttls, elapsed

    def single(self, keys, limits, now, cost):
        return self._run(keys, limits_script.Limits.args(now, cost, limits))

    def state(self, keys_algs):
        """Each key's content, read according to its algorithm."""
        pipe = self.r.pipeline(transaction=False)
        for k, alg in keys_algs:
            if alg == "sliding_window_log":
                pipe.zrange(k, 0, -1, withscores=True)
            elif alg in ("gcra", "leaky_bucket"):
                pipe.get(k)
            else:
                pipe.hgetall(k)
        return pipe.execute()


def key(ns, route, client, i):
    # The keys of one check share one {hash tag}, as the daemon's do.
    return "%s:{r%d:c%d}:l%d" % (ns, route, client, i)


def step(rng, t, us):
    x = rng.random()
    if x < 0.25:
        return 0
    if x < 0.5:
        return rng.randint(1, 50 * MS)
    if x < 0.65:
        u = rng.choice(us)
        return (t // u + 1) * u - t + rng.choice([-1, 0, 1])   # a boundary +-1 us
    if x < 0.75:
        return rng.randint(1, 2) * rng.choice(us)
    if x < 0.96:
        return rng.randint(1, 1500 * MS)
    return rng.randint(3 * S, 30 * S)


N_BATCHES = 60


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_random_batches_match_models_and_single_calls(redis_server, seed):
    rng = random.Random("script-batches-%d" % seed)
    routes = random_routes(rng)
    assert sorted({lim[0] for route in routes for lim in route}) == sorted(ALGS)
    clients = [rng.randint(2, 3) for _ in routes]
    us = sorted({u for route in routes for lim in route for u in models.units(lim) if u > 0})
    script = Script(redis_server.client())
    state = {}                      # (route, client) -> the models of its limits
    stats = dict(checks=0, denied=0, by_batch=0, split=0, delayed=0, repeats=0,
                 same_instant=0)
    t = BASE + rng.randrange(0, 10 ** 9)
    prev_t = None
    for b in range(N_BATCHES):
        picks = []
        for _ in range(rng.randint(1, 40)):
            ri = rng.randrange(len(routes))
            picks.append((ri, rng.randrange(clients[ri]), rng.choice(COSTS)))
        checks = [([key("rb", ri, ci, i) for i in range(len(routes[ri]))], routes[ri], cost)
                  for ri, ci, cost in picks]
        got, batch_ttls, batch_ms = script.batch(checks, t)

        # Models at the start of the batch, to tell which denials only the
        # earlier checks of this very batch explain.
        start = {(ri, ci): [m.clone() for m in state[(ri, ci)]]
                 for ri, ci, _ in picks if (ri, ci) in state}
        single_ttls = {}            # singles key -> (last PTTL other than -1, ms)
        for j, (ri, ci, cost) in enumerate(picks):
            limits = routes[ri]
            ms = state.setdefault((ri, ci), [models.make(lim) for lim in limits])
            expected, _ = models.route_call(ms, t, cost)
            skeys = [key("rs", ri, ci, i) for i in range(len(limits))]
            alone, ttls, alone_ms = script.single(skeys, limits, t, cost)
            for k, v in ttls.items():
                if v != -1:
                    single_ttls[k] = (v, alone_ms)
            same_client = [(jj, picks[jj][2], got[jj][0]) for jj in range(j)
                           if picks[jj][:2] == (ri, ci)]
            ctx = ("seed=%d batch=%d check=%d of %d t=BASE+%d route=%d client=%d cost=%d\n"
                   "limits   %r\nexpected %r\nbatch    %r\nalone    %r\n"
                   "earlier checks of this client in the batch (index, cost, allowed): %r"
                   % (seed, b, j, len(picks), t - BASE, ri, ci, cost, limits,
                      expected, got[j], alone, same_client))
            assert got[j] == expected, "batch != model: %s\n%s" % (
                field_diff(got[j], expected), ctx)
            assert alone == expected, "alone != model: %s\n%s" % (
                field_diff(alone, expected), ctx)

            stats["checks"] += 1
            stats["repeats"] += bool(same_client)
            if not expected[0]:
                stats["denied"] += 1
                per_limit = {expected[2 + 5 * i] for i in range(len(limits))}
                stats["split"] += per_limit == {0, 1}
                fresh = start.get((ri, ci)) or [models.make(lim) for lim in limits]
                stats["by_batch"] += models.would_pass(fresh, t, cost)
            else:
                stats["delayed"] += any(expected[2 + 5 * i + 4] for i in range(len(limits)))

        # What the batch wrote equals what the one-by-one calls wrote:
        # content, and expiry (the PTTL of the last write, to within the
        # real time the calls took; -1 = not written in this batch).
        touched = {}
        for ri, ci, _ in picks:
            for i, lim in enumerate(routes[ri]):
                touched[(ri, ci, i)] = lim[0]
        pairs = [((key("rb", *x), alg), (key("rs", *x), alg)) for x, alg in touched.items()]
        in_batch = script.state([p[0] for p in pairs])
        alone_state = script.state([p[1] for p in pairs])
        for ((bk, alg), (sk, _)), vb, vs in zip(pairs, in_batch, alone_state):
            ctx = "seed=%d batch=%d t=BASE+%d key %s (%s)" % (seed, b, t - BASE, bk, alg)
            assert vb == vs, "%s: batch wrote %r, one by one %r" % (ctx, vb, vs)
            tb = batch_ttls[bk]
            ts, alone_ms = single_ttls.get(sk, (-1, 0))
            if tb < 0 or ts < 0:
                assert tb == ts, "%s: PTTL batch %d, one by one %d" % (ctx, tb, ts)
            else:
                slack = batch_ms + alone_ms + 2
                assert abs(tb - ts) <= slack, "%s: PTTL batch %d, one by one %d (+-%d)" % (
                    ctx, tb, ts, slack)

        stats["same_instant"] += prev_t == t
        prev_t = t
        t += step(rng, t, us)

    # The runs must really have exercised the contract.
    n = stats["checks"]
    assert n // 10 < stats["denied"] < n * 9 // 10, stats
    assert stats["repeats"] > n // 3, stats        # a key several times in a batch
    assert stats["by_batch"] > n // 20, stats      # denied only by earlier checks of the batch
    assert stats["split"] > 0, stats               # all-or-nothing within a batch
    assert stats["delayed"] > 0, stats             # leaky bucket delays in batches
    assert stats["same_instant"] > 0, stats        # two batches at one instant


def test_one_key_many_times_in_one_batch(redis_server):
    """60 checks of cost 1 on one fixed window of 50: exactly the first 50
    pass, counting remaining down 49..0; the last 10 are denied."""
    L = limits_script.Limits(redis_server.client())
    lim = ("fixed_window", 50, 10 * S, 0)
    t = BASE + 2_500_000                           # 7.5 s before the window ends
    replies = L.call_batch([(["fw:{one}"], [lim], 1)] * 60, t)
    assert len(replies) == 60
    for i, rep in enumerate(replies):
        if i < 50:
            want = [1, t // MS, 1, 49 - i, 7500, 0, 0]
        else:
            want = [0, t // MS, 0, 0, 7500, 7500, 0]
        assert rep == want, "check %d: %s" % (i, field_diff(rep, want))
    # 50 charged, no more: still full at that instant, fresh in the next window
    assert L.call(["fw:{one}"], [lim], t) == [0, t // MS, 0, 0, 7500, 7500, 0]
    t2 = BASE + 10 * S
    assert L.call(["fw:{one}"], [lim], t2) == [1, t2 // MS, 1, 49, 10000, 0, 0]


DENIERS = {          # a quota of 2 in each algorithm
    "fixed_window": ("fixed_window", 2, 10 * S, 0),
    "sliding_window_log": ("sliding_window_log", 2, 10 * S, 0),
    "sliding_window_counter": ("sliding_window_counter", 2, 10 * S, S),
    "token_bucket": ("token_bucket", 2, 1, S),
    "leaky_bucket": ("leaky_bucket", 2, 1, S),
    "gcra": ("gcra", 2, 1, S),
}


@pytest.mark.parametrize("alg", ALGS)
def test_denied_check_in_batch_charges_no_limit(redis_server, alg):
    """A 3-limit route whose middle limit (each algorithm in turn) allows 2:
    in one batch the first two checks pass, the next two are denied by that
    limit alone, and the two generous limits are not charged for them, as
    the later checks of the batch and a follow-up call both see."""
    L = limits_script.Limits(redis_server.client())
    fw = ("fixed_window", 50, 10 * S, 0)
    tb = ("token_bucket", 50, 1, S)
    limits = [fw, DENIERS[alg], tb]
    keys = ["k:{c}:fw", "k:{c}:deny", "k:{c}:tb"]
    t = BASE + 2_500_000
    replies = L.call_batch([(keys, limits, 1)] * 4 + [([keys[0], keys[2]], [fw, tb], 1)], t)
    for i, rep in enumerate(replies[:4]):
        allowed = i < 2
        assert rep[0] == int(allowed), (i, rep)
        assert [rep[2], rep[7], rep[12]] == [1, int(allowed), 1], (i, rep)
        # generous limits: after the charge when allowed, as they stand when not
        want = 49 - i if allowed else 48
        assert (rep[3], rep[13]) == (want, want), (i, rep)
        assert rep[8] == (1 - i if allowed else 0), (i, rep)
        assert (rep[5], rep[15]) == (0, 0) and (rep[10] > 0) == (not allowed), (i, rep)
    # the fifth check (generous limits only) sees 2 charges, not 4
    assert replies[4][0] == 1 and (replies[4][3], replies[4][8]) == (47, 47), replies[4]
    # a follow-up call sees 3 charges on the generous limits, 2 on the denier
    follow_up = L.call([keys[0], keys[2]], [fw, tb], t)
    assert (follow_up[0], follow_up[3], follow_up[8]) == (1, 46, 46), follow_up
    rep = L.call([keys[1]], [DENIERS[alg]], t)
    assert (rep[0], rep[3]) == (0, 0), rep
    # and the models agree with every reply above
    ms = [models.make(lim) for lim in limits]
    for i in range(4):
        assert models.route_call(ms, t, 1)[0] == replies[i], i
    assert models.route_call([ms[0], ms[2]], t, 1)[0] == replies[4]
    assert models.route_call([ms[0], ms[2]], t, 1)[0] == follow_up
    assert models.route_call([ms[1]], t, 1)[0] == rep


FW = ["fixed_window", "5", str(10 * S), "0"]
T = str(BASE + 2_500_000)

MALFORMED = [
    # (name, KEYS, ARGV after the forced time, error text). A well-formed
    # call is: set count, the sets (limit count, then algorithm, a, b, c
    # per limit), then per check its set's index and its cost.
    ("no sets", [], [], "bad set count"),
    ("zero sets, a check", [], ["0", "1", "1"], "bad set index"),
    ("zero sets, a key", ["a"], ["0"], "more keys than limits"),
    ("set count not a number", ["a"], ["x", "1", *FW, "1", "1"], "bad set count"),
    ("set count not an integer", ["a"], ["1.5", "1", *FW, "1", "1"], "bad set count"),
    ("set count huge", ["a"], ["1e9", "1", *FW, "1", "1"], "bad set count"),
    ("more sets than arguments", ["a"], ["2", "1", *FW, "1", "1"], "bad set count"),
    ("zero limits", [], ["1", "0", "1", "1", "1", "1"], "bad limit count"),
    ("zero limits, second set", ["a"], ["2", "1", *FW, "0", "1", "1", "1", "1"],
     "bad limit count"),
    ("more limits than arguments", ["a", "b", "c"], ["1", "3", *FW], "bad limit count"),
    ("limit count not a number", ["a"], ["1", "x", *FW, "1", "1"], "bad limit count"),
    ("limit count not an integer", ["a", "b"], ["1", "1.5", *FW, *FW, "1", "1"],
     "bad limit count"),
    ("limit count huge", ["a"], ["1", "1e9", *FW, "1", "1"], "bad limit count"),
    ("limit parameter not a number", ["a"],
     ["1", "1", "fixed_window", "5", "x", "0", "1", "1"], "bad limit parameters"),
    ("limit parameter missing, second set", ["a", "b"],
     ["2", "1", *FW, "1", "fixed_window", "5", "", "0", "1", "1", "2", "1"],
     "bad limit parameters"),
    ("unknown algorithm", ["a"], ["1", "1", "nope", "5", "1", "0", "1", "1"],
     "unknown algorithm"),
    ("unknown algorithm, second set", ["a", "b"],
     ["2", "1", *FW, "1", "nope", "5", "1", "0", "1", "1", "2", "1"], "unknown algorithm"),
    ("unknown algorithm, second limit", ["a", "b"],
     ["1", "2", *FW, "nope", "5", "1", "0", "1", "1"], "unknown algorithm"),
    ("unknown algorithm in a set no check uses", ["a"],
     ["2", "1", *FW, "1", "nope", "5", "1", "0", "1", "1"], "unknown algorithm"),
    ("set index 0", ["a"], ["1", "1", *FW, "0", "1"], "bad set index"),
    ("set index past the sets", ["a"], ["1", "1", *FW, "2", "1"], "bad set index"),
    ("set index not an integer", ["a"], ["2", "1", *FW, "1", *FW, "1.5", "1"],
     "bad set index"),
    ("set index x", ["a"], ["1", "1", *FW, "x", "1"], "bad set index"),
    ("set index nan", ["a"], ["1", "1", *FW, "nan", "1"], "bad set index"),
    ("set index past the sets, second check", ["a", "b"],
     ["1", "1", *FW, "1", "1", "3", "1"], "bad set index"),
    ("cost missing", ["a"], ["1", "1", *FW, "1"], "bad cost"),
    ("cost 0", ["a"], ["1", "1", *FW, "1", "0"], "bad cost"),
    ("cost x", ["a"], ["1", "1", *FW, "1", "x"], "bad cost"),
    ("cost empty", ["a"], ["1", "1", *FW, "1", ""], "bad cost"),
    ("cost negative", ["a"], ["1", "1", *FW, "1", "-1"], "bad cost"),
    ("cost not an integer", ["a"], ["1", "1", *FW, "1", "1.5"], "bad cost"),
    ("cost nan", ["a"], ["1", "1", *FW, "1", "nan"], "bad cost"),
    ("cost infinite", ["a"], ["1", "1", *FW, "1", "inf"], "bad cost"),
    ("cost huge", ["a"], ["1", "1", *FW, "1", "1e400"], "bad cost"),
    ("cost 0, second check", ["a", "b"], ["1", "1", *FW, "1", "1", "1", "0"], "bad cost"),
    ("cost x, second check", ["a", "b"], ["1", "1", *FW, "1", "1", "1", "x"], "bad cost"),
    ("more limits than keys", ["a"], ["1", "2", *FW, *FW, "1", "1"],
     "more limits than keys"),
    ("more limits than keys, second check", ["a"], ["1", "1", *FW, "1", "1", "1", "1"],
     "more limits than keys"),
    ("more keys than limits", ["a", "b"], ["1", "1", *FW, "1", "1"], "more keys than limits"),
    ("more keys than limits, two checks", ["a", "b", "c"],
     ["1", "1", *FW, "1", "1", "1", "1"], "more keys than limits"),
    ("keys without checks", ["a"], ["1", "1", *FW], "more keys than limits"),
]


@pytest.mark.parametrize("name,keys,argv,error", MALFORMED,
                         ids=[m[0] for m in MALFORMED])
def test_malformed_batch_is_an_error(redis_server, name, keys, argv, error):
    """A malformed batch answers a Redis error (no reply at all, so never a
    partial one), Redis keeps serving, and nothing is written: the whole
    batch is checked before any check in it is decided, so a bad later
    check cannot leave earlier ones charged."""
    r = redis_server.client()
    L = limits_script.Limits(r)
    keys = ["m:{x}:" + k for k in keys]
    with pytest.raises(redis.exceptions.ResponseError) as e:
        r.evalsha(L.sha, len(keys), *keys, T, *argv)
    assert "ratelimitd: " + error in str(e.value), str(e.value)
    assert r.ping()
    assert r.dbsize() == 0, r.keys("*")
    # the script still answers a well-formed batch
    assert L.call_batch([(["m:{y}:a"], [("fixed_window", 5, 10 * S, 0)], 1)] * 2,
                        int(T)) == [[1, int(T) // MS, 1, 4, 7500, 0, 0],
                                    [1, int(T) // MS, 1, 3, 7500, 0, 0]]


def test_the_links_probe_is_answered_without_an_error(redis_server):
    """Each new link's probe (`EVALSHA sha 0 0 0`: no keys, time 0, no sets, no checks) gets an
    empty answer: an error there showed in Redis's errorstats and in
    EVALSHA's failed_calls once per connect, where operators alert."""
    r = redis_server.client()
    L = limits_script.Limits(r)
    r.config_resetstat()
    assert r.evalsha(L.sha, 0, "0", "0") == []
    assert r.dbsize() == 0
    assert r.info("errorstats") == {}
    assert r.info("commandstats")["cmdstat_evalsha"]["failed_calls"] == 0
