"""Exact limits across a fleet: three sidecars on one Redis, every algorithm.

SPEC §1: many sidecars share one Redis, "so a limit holds across the whole
fleet"; §6: every algorithm runs atomically in one script call, with time
from Redis. test_concurrency.py checks fixed_window and token_bucket on one
daemon and fixed_window on two. Here each of the six algorithms of SPEC §6
gets a fleet of three daemons (`server.workers: 2` each, so six event loops,
six Redis connections and six deny caches) on one Redis, and a concurrent
burst spread round-robin over them:

  * cost 1 over /check, 3x the quota: exactly `quota` allowed, the rest
    denied with the route's own deny_status, and every remaining value
    quota-1 .. 0 handed out once (SPEC §3.1 / README: all six report exact
    remaining);
  * cost 3 over POST /v1/check (the only way a check names its cost), quota
    50: exactly floor(50/3) = 16 allowed, remaining 47, 44, .. 2 each once,
    and then exactly the 2 units left to cost-1 checks: nothing lost,
    nothing extra;
  * costs 1, 2, 3, 5 and 7 at once: the allowed charges chain from the
    quota down, each denial had less left than its cost, and what is left
    afterwards goes to cost-1 checks, exactly;
  * after each burst, each daemon, over fresh connections (either worker),
    denies the spent key (after the first two, twice: Redis's denial, then
    the deny cache's; it must not let anything extra through, nor deny
    what Redis would allow), and a fresh key is allowed on every daemon,
    its remaining counting down across the fleet.

One test (one fleet, one Redis) per algorithm, its three keys in turn: a
fleet costs more to start and stop than its bursts take.

Limits are set so that time returns nothing during a test: 1h windows
(avoid_hour_boundary keeps a test clear of the top of the hour, where a
fixed window's count starts over) and buckets refilling 1/h, which is
2.8e-4 of a unit per second. leaky_bucket runs with `delay: false`: with
`delay: true` the k-th of a fresh client's burst is held (k-1)/rate, hours
at 1/h (the shaping hold is test_shaping_holds.py's subject). The Redis
deadline is 2 s, as in test_concurrency.py: a fail-open reply under a burst
from 2 cores would (rightly) allow extra, and is asserted absent.
"""
import json

import pytest
import requests

from helpers import check, concurrently, hammer, policy, session, vcheck

QUOTA = 50
COST = 3
DAEMONS = 3
DENY = 403  # every route's own deny_status (the server's stays 429)

# algorithm -> its parameters: quota 50, nothing given back within a test.
LIMITS = {
    "fixed_window": "limit: 50, window: 1h",
    "sliding_window_log": "limit: 50, window: 1h",
    "sliding_window_counter": "limit: 50, window: 1h",
    "token_bucket": 'rate: "1/h", burst: 50',
    "leaky_bucket": 'rate: "1/h", burst: 50, delay: false',
    "gcra": 'rate: "1/h", burst: 50',
}
ALGORITHMS = sorted(LIMITS)

POL = policy(
    "".join(
        "  - name: %s\n    match: {prefix: /%s/}\n    key: header:K\n"
        "    deny_status: %d\n"
        "    limits: [{name: q, algorithm: %s, %s}]\n" % (a, a, DENY, a, LIMITS[a])
        for a in ALGORITHMS),
    server="  workers: 2\n",
    timeout="2s")


def vhammer(urls_and_bodies, workers=50):
    """POST /v1/check each (url, body) from `workers` threads, one Session
    per thread (hammer's, for GET, in helpers); returns
    [(status, X-RateLimit-Remaining, JSON body)] in order."""
    def one(arg):
        url, body = arg
        r = session().post(url, data=json.dumps(body), timeout=10,
                           headers={"Content-Type": "application/json"})
        return r.status_code, r.headers.get("X-RateLimit-Remaining"), r.json()
    return concurrently(one, urls_and_bodies, workers)


@pytest.fixture
def fleet(start_daemon):
    ds = [start_daemon(POL) for _ in range(DAEMONS)]
    assert len({d.port for d in ds}) == DAEMONS
    for d in ds:
        assert requests.get(d.url("/v1/policy"), timeout=5).json()["server"]["workers"] == 2
    return ds


def get(d, algo, key):
    # A fresh connection each time: either worker of the daemon may take it.
    return check(d, "/check/%s/x" % algo, headers={"K": key})


def cost_1_burst(fleet, algo):
    """3x the quota at cost 1 over /check, round-robin over the fleet."""
    n = 3 * QUOTA
    jobs = [(fleet[i % DAEMONS].url("/check/%s/x" % algo), {"K": "hot"})
            for i in range(n)]
    res = hammer(jobs, workers=50)
    statuses = [s for s, _ in res]
    assert statuses.count(200) == QUOTA, (algo, statuses)
    assert statuses.count(DENY) == n - QUOTA, (algo, statuses)
    assert "-1" not in [rem for _, rem in res], (algo, "failed open under the burst")
    # every remaining value quota-1 .. 0 handed out exactly once; a denial
    # charges nothing and reports what was left: nothing.
    allowed_rem = sorted(int(rem) for s, rem in res if s == 200)
    assert allowed_rem == list(range(QUOTA)), (algo, allowed_rem)
    assert {rem for s, rem in res if s == DENY} == {"0"}, algo

    # Afterwards, one by one: spent on every daemon (Redis's denial, then
    # the deny cache's), and a fresh key allowed on every daemon, counted
    # once across the fleet.
    for _ in range(2):
        for d in fleet:
            r = get(d, algo, "hot")
            assert r.status_code == DENY, (algo, d.port, r.status_code, r.headers)
            assert r.headers["X-RateLimit-Remaining"] == "0", (algo, r.headers)
            assert r.headers["X-RateLimit-Limit"] == str(QUOTA), (algo, r.headers)
            assert int(r.headers["Retry-After"]) >= 1, (algo, r.headers)
    rems = []
    for d in fleet:
        r = get(d, algo, "fresh-1")
        assert r.status_code == 200, (algo, d.port, r.status_code)
        rems.append(r.headers["X-RateLimit-Remaining"])
    assert rems == [str(QUOTA - 1 - k) for k in range(DAEMONS)], (algo, rems)


def cost_3_burst(fleet, algo):
    """3x what fits at cost 3 over POST /v1/check, round-robin."""
    fits = QUOTA // COST                      # 16
    left = QUOTA - fits * COST                # 2
    n = 3 * fits
    jobs = [(fleet[i % DAEMONS].url("/v1/check"),
             {"route": algo, "key": "costly", "cost": COST}) for i in range(n)]
    res = vhammer(jobs, workers=48)
    statuses = [s for s, _, _ in res]
    assert statuses.count(200) == fits, (algo, statuses)
    assert statuses.count(DENY) == n - fits, (algo, statuses)
    assert not any(body.get("degraded") for _, _, body in res), (algo, "failed open")
    allowed_rem = sorted(int(rem) for s, rem, _ in res if s == 200)
    assert allowed_rem == list(range(left, QUOTA - COST + 1, COST)), (algo, allowed_rem)
    assert {rem for s, rem, _ in res if s == DENY} == {str(left)}, algo
    for s, rem, body in res:
        assert body["allowed"] is (s == 200) and body["remaining"] == int(rem), body

    # Cost 3 stays denied on every daemon, twice (a denial with units left
    # is asked of Redis each time; it must not be cached as "nothing left").
    for _ in range(2):
        for d in fleet:
            r = vcheck(d, {"route": algo, "key": "costly", "cost": COST})
            assert r.status_code == DENY, (algo, d.port, r.status_code, r.text)
            assert r.json()["remaining"] == left, (algo, r.text)
    # Exactly the units left pass at cost 1, whichever daemon asks; then
    # nothing, on every daemon.
    seq = [vcheck(fleet[k % DAEMONS], {"route": algo, "key": "costly"})
           for k in range(left + DAEMONS)]
    assert [r.status_code for r in seq] == [200] * left + [DENY] * DAEMONS, \
        (algo, [(r.status_code, r.text) for r in seq])
    assert [r.json()["remaining"] for r in seq[:left]] == list(range(left - 1, -1, -1))
    # and cost 3, denied above with units left, now sees none left on every
    # daemon: no stale cached reply of the denials before.
    for d in fleet:
        r = vcheck(d, {"route": algo, "key": "costly", "cost": COST})
        assert (r.status_code, r.json()["remaining"]) == (DENY, 0), (algo, d.port, r.text)
    # A fresh key: cost 3 on each daemon in turn, counted once fleet-wide.
    rems = []
    for d in fleet:
        r = vcheck(d, {"route": algo, "key": "fresh-3", "cost": COST})
        assert r.status_code == 200, (algo, d.port, r.status_code, r.text)
        rems.append(r.json()["remaining"])
    assert rems == [QUOTA - COST * (k + 1) for k in range(DAEMONS)], (algo, rems)


def mixed_cost_burst(fleet, algo):
    """Costs 1, 2, 3, 5 and 7 at once on one key: the allowed ones' charges
    chain from the quota down (each remaining is the previous one less its
    cost, none lost or double-counted), each denial had less left than its
    cost, and cost-1 checks afterwards get exactly what is left, on
    whichever daemon they ask."""
    costs = [(1, 2, 3, 5, 7)[i % 5] for i in range(40)]      # 152 units
    jobs = [(fleet[i % DAEMONS].url("/v1/check"),
             {"route": algo, "key": "mixed", "cost": c}) for i, c in enumerate(costs)]
    res = vhammer(jobs, workers=40)
    assert not any(body.get("degraded") for _, _, body in res), (algo, "failed open")
    chain = sorted(((b["remaining"], c) for c, (s, _, b) in zip(costs, res) if s == 200),
                   reverse=True)
    prev = QUOTA
    for rem, c in chain:
        assert rem == prev - c, (algo, chain)
        prev = rem
    for c, (s, _, b) in zip(costs, res):
        assert s == 200 or (s == DENY and b["remaining"] < c), (algo, c, s, b)
    seq = [vcheck(fleet[k % DAEMONS], {"route": algo, "key": "mixed"})
           for k in range(prev + DAEMONS)]
    assert [r.status_code for r in seq] == [200] * prev + [DENY] * DAEMONS, \
        (algo, prev, [(r.status_code, r.text) for r in seq])


@pytest.mark.parametrize("algo", ALGORITHMS)
def test_fleet_limit_exact(fleet, algo):
    """One fleet per algorithm (a fresh Redis each), three keys in turn."""
    cost_1_burst(fleet, algo)
    cost_3_burst(fleet, algo)
    mixed_cost_burst(fleet, algo)
