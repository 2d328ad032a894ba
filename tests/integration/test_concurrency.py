"""Concurrency: exact limits under concurrent load, and one limit shared by
two daemons on one Redis (SPEC §1, §6)."""
import requests

from helpers import avoid_hour_boundary  # noqa: F401  (autouse)
from helpers import hammer, policy

# A generous Redis deadline here: these tests are about exact counting, and
# a fail-open reply under a burst from 2 cores would (rightly) allow extra.
POL = policy(
    "  - name: t\n    match: {prefix: /t/}\n    key: header:K\n"
    '    limits: [{name: b, algorithm: token_bucket, rate: "1/h", burst: 50}]\n'
    "  - name: c\n    match: {prefix: /}\n    key: header:K\n"
    "    limits: [{name: q, algorithm: fixed_window, limit: 50, window: 1h}]\n",
    timeout="2s")

def test_200_concurrent_one_key_limit_50(start_daemon):
    d = start_daemon(POL)
    res = hammer([(d.url("/check/x"), {"K": "hot"})] * 200, workers=200)
    statuses = [s for s, _ in res]
    assert statuses.count(200) == 50, statuses
    assert statuses.count(429) == 150
    assert "-1" not in [rem for _, rem in res]
    # every remaining value 0..49 handed out exactly once to the allowed ones
    allowed_rem = sorted(int(rem) for s, rem in res if s == 200)
    assert allowed_rem == list(range(50))


def test_200_concurrent_token_bucket(start_daemon):
    d = start_daemon(POL)
    res = hammer([(d.url("/check/t/x"), {"K": "hot"})] * 200)
    statuses = [s for s, _ in res]
    assert statuses.count(200) == 50, statuses
    assert statuses.count(429) == 150


def test_concurrent_many_keys_no_crosstalk(start_daemon):
    d = start_daemon(POL)
    jobs = [(d.url("/check/x"), {"K": "key-%d" % (i % 8)}) for i in range(8 * 60)]
    res = hammer(jobs)
    for k in range(8):
        mine = [res[i][0] for i in range(len(jobs)) if i % 8 == k]
        assert mine.count(200) == 50, (k, mine.count(200))


def test_two_daemons_share_one_limit(start_daemon):
    d1 = start_daemon(POL)
    d2 = start_daemon(POL)
    assert d1.port != d2.port
    jobs = []
    for i in range(160):
        d = d1 if i % 2 else d2
        jobs.append((d.url("/check/x"), {"K": "shared"}))
    res = hammer(jobs, workers=40)
    statuses = [s for s, _ in res]
    assert statuses.count(200) == 50, statuses
    # sequentially too: both daemons deny now, another key is fresh on both
    assert requests.get(d1.url("/check/x"), headers={"K": "shared"}, timeout=5).status_code == 429
    assert requests.get(d2.url("/check/x"), headers={"K": "shared"}, timeout=5).status_code == 429
    r1 = requests.get(d1.url("/check/x"), headers={"K": "other"}, timeout=5)
    r2 = requests.get(d2.url("/check/x"), headers={"K": "other"}, timeout=5)
    assert r1.headers["X-RateLimit-Remaining"] == "49"
    assert r2.headers["X-RateLimit-Remaining"] == "48"


def test_keepalive_connections_many_requests(start_daemon):
    d = start_daemon(POL)
    s = requests.Session()
    rems = []
    for _ in range(60):
        r = s.get(d.url("/check/x"), headers={"K": "ka"}, timeout=5)
        rems.append(r.headers["X-RateLimit-Remaining"])
    assert rems[:50] == [str(n) for n in range(49, -1, -1)]
    assert rems[50:] == ["0"] * 10
