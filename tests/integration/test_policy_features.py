"""Policy features (SPEC §3.1, §3.2, §4): per-key overrides (their limits
replace the route's; `unlimited: true` passes without headers), shadow routes
(charged and reported as if enforced, always 200), the IETF RateLimit
headers, and a route's deny_status over server.deny_status."""
import re

import requests

from ops_helpers import check, fw, get_policy, ops_daemon, policy, route, vcheck  # noqa: F401

RL = ("X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "Retry-After",
      "RateLimit", "RateLimit-Policy")

OVERRIDES = policy(route(
    "api", "/api/", fw(2), key="header:X-Api-Key",
    extra="    overrides:\n"
          "      - {keys: [partner-1], limits: [{name: big, algorithm: fixed_window, "
          "limit: 5, window: 1h}]}\n"
          "      - {keys: [partner-2], limits: [{algorithm: gcra, rate: \"1/h\", burst: 4}]}\n"
          "      - {keys: [internal-monitor], unlimited: true}\n"))


def statuses(d, key, n, path="/check/api/x"):
    return [check(d, path, headers={"X-Api-Key": key}).status_code for _ in range(n)]


def test_override_limits_replace_the_routes(ops_daemon):
    d = ops_daemon(OVERRIDES)
    assert statuses(d, "k1", 3) == [200, 200, 429]
    got = [check(d, "/check/api/x", headers={"X-Api-Key": "partner-1"}) for _ in range(6)]
    assert [r.status_code for r in got] == [200] * 5 + [429]
    assert [r.headers["X-RateLimit-Limit"] for r in got] == ["5"] * 6
    assert [r.headers["X-RateLimit-Remaining"] for r in got] == ["4", "3", "2", "1", "0", "0"]
    # the override replaces the route's limits: only "big" is applied
    body = vcheck(d, {"route": "api", "key": "partner-1"}).json()
    assert [(l["name"], l["limit"]) for l in body["limits"]] == [("big", 5)]
    # an unnamed override limit is named after its algorithm
    r = check(d, "/check/api/x", headers={"X-Api-Key": "partner-2"})
    assert r.status_code == 200 and r.headers["X-RateLimit-Limit"] == "4"
    body = vcheck(d, {"route": "api", "key": "partner-2"}).json()
    assert [(l["name"], l["algorithm"], l["limit"]) for l in body["limits"]] == \
        [("gcra", "gcra", 4)]
    assert body["limits"][0]["remaining"] == 2
    # keys match exactly: a near miss gets the route's limits
    r = check(d, "/check/api/x", headers={"X-Api-Key": "partner-1x"})
    assert r.status_code == 200 and r.headers["X-RateLimit-Limit"] == "2"


def test_a_route_with_many_override_keys_finds_each(ops_daemon):
    """Overrides are looked up in a sorted index, not by walking every key
    on every check (an audit: 1.45 million keys cost 8 ms a check). The
    index must still give each key its own override (a key may be listed
    once) and everyone else the route's limits."""
    n = 60000
    groups = [("a", 3, range(0, n // 2)), ("b", 5, range(n // 2, n))]
    overrides = "".join(
        "      - keys: [%s]\n        limits: [%s]\n" % (
            ", ".join("c%06d" % i for i in keys), fw(limit, name="o" + name))
        for name, limit, keys in groups)
    d = ops_daemon(policy(route("api", "/api/", fw(2), key="header:X-Api-Key",
                                extra="    overrides:\n" + overrides)))
    for key, limit in (("c000000", "3"), ("c029999", "3"), ("c030000", "5"),
                       ("c045123", "5"), ("c059999", "5"), ("c060000", "2"),
                       ("c000007", "3"), ("c00000", "2"), ("C000000", "2"),
                       ("c0000000", "2")):
        r = check(d, "/check/api/x", headers={"X-Api-Key": key})
        assert r.status_code == 200 and r.headers["X-RateLimit-Limit"] == limit, (key, r.headers)


def test_unlimited_override_passes_without_headers(ops_daemon):
    d = ops_daemon(OVERRIDES)
    for _ in range(10):
        r = check(d, "/check/api/x", headers={"X-Api-Key": "internal-monitor"})
        assert r.status_code == 200
        assert not [h for h in RL if h in r.headers], dict(r.headers)
    r = vcheck(d, {"route": "api", "key": "internal-monitor"})
    assert r.status_code == 200 and r.json()["allowed"] is True
    assert not [h for h in RL if h in r.headers], dict(r.headers)
    # the other clients are still limited
    assert statuses(d, "k1", 3) == [200, 200, 429]


SHADOW = policy(route("sh", "/sh/", fw(2) + ", " + fw(10, name="big"),
                      extra="    shadow: true\n"))


def test_shadow_route_always_200_headers_tell_the_truth(ops_daemon):
    d = ops_daemon(SHADOW)
    got = [check(d, "/check/sh/x", headers={"X-Key": "s"}) for _ in range(4)]
    assert [r.status_code for r in got] == [200] * 4
    assert [r.headers.get("X-RateLimit-Limit") for r in got] == ["2"] * 4
    assert [r.headers.get("X-RateLimit-Remaining") for r in got] == ["1", "0", "0", "0"]
    assert all(int(r.headers["X-RateLimit-Reset"]) >= 1 for r in got)
    assert all(r.text == "" for r in got)


def test_shadow_json_limits_tell_the_truth(ops_daemon):
    """/v1/check on a shadow route: always 200, limits[].allowed false for
    the limit that would deny, and charged as if enforced: a request the
    route would deny charges none of its limits."""
    d = ops_daemon(SHADOW)
    first = vcheck(d, {"route": "sh", "key": "j"})
    assert first.status_code == 200
    assert [l["allowed"] for l in first.json()["limits"]] == [True, True]
    vcheck(d, {"route": "sh", "key": "j"})
    for _ in range(3):
        r = vcheck(d, {"route": "sh", "key": "j"})
        assert r.status_code == 200
        b = r.json()
        q, big = b["limits"]
        assert (q["name"], q["allowed"], q["remaining"]) == ("q", False, 0)
        assert (big["name"], big["remaining"]) == ("big", 8)
        assert b["limit"] == 2 and b["remaining"] == 0
        assert r.headers["X-RateLimit-Remaining"] == "0"


def test_shadow_route_never_denies_a_missing_key(ops_daemon):
    """A shadow route answered a request without its key 403, as an
    enforced route does: putting a new route in shadow blocked every
    client that had no key. It is 200 now, counted as shadow_denied (what
    enforcement would have done); /v1/check names the reason beside its
    verdict. The enforced route beside it still denies."""
    d = ops_daemon(policy(route("sh", "/sh/", fw(2), extra="    shadow: true\n") +
                          route("api", "/api/", fw(2))))
    r = check(d, "/check/sh/x")
    assert (r.status_code, r.text) == (200, ""), (r.status_code, r.text)
    assert not [h for h in RL if h in r.headers], dict(r.headers)
    r = vcheck(d, {"path": "/sh/x"})
    assert r.status_code == 200 and r.json() == {
        "allowed": True, "error": "missing_key", "route": "sh"}, r.text
    assert check(d, "/check/api/x").status_code == 403
    text = requests.get(d.url("/metrics"), timeout=5).text
    assert 'ratelimitd_checks_total{route="sh",result="shadow_denied"} 2' in text, text
    assert 'route="sh",result="denied"' not in text, text
    assert 'ratelimitd_checks_total{route="api",result="denied"} 1' in text, text


IETF = policy(route(
    "api", "/api/",
    '{name: burst, algorithm: token_bucket, rate: "10/s", burst: 20}, '
    '{name: hourly, algorithm: fixed_window, limit: 1000, window: 1h}, '
    '{algorithm: gcra, rate: "2/s", burst: 5}, '
    '{name: slow, algorithm: leaky_bucket, rate: "5/10s", burst: 3, delay: false}'),
    server="  ietf_headers: true\n")

IETF_POLICY = '"burst";q=20;w=2, "hourly";q=1000;w=3600, "gcra";q=5;w=3, "slow";q=3;w=6'
ITEM = re.compile(r'^"([^"]+)";r=(\d+);t=(\d+)$')


def ratelimit_items(value):
    out = []
    for item in value.split(", "):
        m = ITEM.match(item)
        assert m, "bad RateLimit item %r in %r" % (item, value)
        out.append((m.group(1), int(m.group(2)), int(m.group(3))))
    return out


def test_ietf_headers_exact(ops_daemon):
    d = ops_daemon(IETF)
    r = check(d, "/check/api/x", headers={"X-Key": "i1"})
    assert r.status_code == 200
    assert r.headers["RateLimit-Policy"] == IETF_POLICY
    items = ratelimit_items(r.headers["RateLimit"])
    assert [(n, rem) for n, rem, _ in items] == \
        [("burst", 19), ("hourly", 999), ("gcra", 4), ("slow", 2)]
    t = {n: tt for n, _, tt in items}
    assert t["burst"] == 1 and t["gcra"] == 1 and t["slow"] == 2
    assert 1 <= t["hourly"] <= 3600
    # the X-RateLimit headers are those of the lowest remaining: "slow"
    assert r.headers["X-RateLimit-Limit"] == "3"
    assert r.headers["X-RateLimit-Remaining"] == "2"
    assert int(r.headers["X-RateLimit-Reset"]) == t["slow"]


def test_ietf_headers_match_json_limits(ops_daemon):
    """On one /v1/check reply, RateLimit's r and t are limits[].remaining
    and limits[].reset, item by item, in policy order; and on a denial the
    fields are still there."""
    d = ops_daemon(IETF)
    for i in range(4):
        r = vcheck(d, {"route": "api", "key": "j1"})
        b = r.json()
        assert r.headers["RateLimit-Policy"] == IETF_POLICY
        items = ratelimit_items(r.headers["RateLimit"])
        assert [(n, rem, t) for n, rem, t in items] == \
            [(l["name"], l["remaining"], l["reset"]) for l in b["limits"]]
        if i < 3:
            assert r.status_code == 200
        else:
            assert r.status_code == 429
            assert "Retry-After" in r.headers
            assert dict((n, rem) for n, rem, _ in items)["slow"] == 0


def test_no_ietf_headers_by_default(ops_daemon):
    d = ops_daemon(policy(route("api", "/api/", fw(1))))
    for _ in range(2):
        r = check(d, "/check/api/x", headers={"X-Key": "n"})
        assert "RateLimit" not in r.headers and "RateLimit-Policy" not in r.headers


DENY = policy(route("own", "/own/", fw(1), extra="    deny_status: 429\n") +
              route("inherit", "/inh/", fw(1)),
              server="  deny_status: 403\n")


def test_route_deny_status_overrides_server(ops_daemon):
    d = ops_daemon(DENY)
    for path, name, status in (("/check/own/x", "own", 429), ("/check/inh/x", "inherit", 403)):
        assert check(d, path, headers={"X-Key": "d"}).status_code == 200
        r = check(d, path, headers={"X-Key": "d"})
        assert r.status_code == status, (name, r.status_code)
        assert r.headers["Content-Type"].startswith("application/json")
        body = r.json()
        assert body["error"] == "rate_limited" and body["route"] == name
        assert body["retry_after"] >= 1
        assert int(r.headers["Retry-After"]) >= 1
        assert r.headers["X-RateLimit-Remaining"] == "0"
        v = vcheck(d, {"route": name, "key": "d"})
        assert v.status_code == status and v.json()["allowed"] is False
    routes = {r["name"]: r for r in get_policy(d)["routes"]}
    assert routes["own"]["deny_status"] == 429
    assert routes["inherit"]["deny_status"] == 403


def test_shadow_route_never_fails_closed(ops_daemon, redis_server):
    """A shadow route always replies 200, so failure_mode closed does not
    turn a Redis outage into a 503 there; an enforced route next to it does
    fail closed."""
    d = ops_daemon(policy(route("sh", "/sh/", fw(2), extra="    shadow: true\n") +
                          route("api", "/api/", fw(2)),
                          top="failure_mode: closed\n"))
    redis_server.kill()
    r = check(d, "/check/api/x", headers={"X-Key": "k"})
    assert r.status_code == 503
    r = check(d, "/check/sh/x", headers={"X-Key": "k"})
    assert r.status_code == 200, (r.status_code, r.text)


def test_v1_policy_shows_long_key_sources_whole(ops_daemon):
    """A key source was written into a 300-byte buffer: a long header name
    was shown cut, and a query name cut inside a UTF-8 character was
    dropped, the route shown with "key": [] (found by an audit)."""
    header, query = "header:" + "X" * 400, "query:" + "\u00e9" * 150
    d = ops_daemon(policy(route("a", "/a/", fw(2), key='"%s"' % header) +
                          route("b", "/b/", fw(2), key='"%s"' % query)))
    routes = {r["name"]: r for r in get_policy(d)["routes"]}
    assert routes["a"]["key"] == [header], routes["a"]["key"]
    assert routes["b"]["key"] == [query], routes["b"]["key"]


def test_v1_policy_writes_values_as_the_file_does(ops_daemon):
    """Durations in the largest whole unit and a rate per one unit as "N/s":
    it said "60s", "3600s" and "10/1s", so the file and /v1/policy could
    not be compared (found by a new user's walk through the README)."""
    d = ops_daemon(policy(route(
        "api", "/api/",
        "{name: a, algorithm: fixed_window, limit: 1, window: 1h}, "
        "{name: b, algorithm: fixed_window, limit: 1, window: 90s}, "
        "{name: c, algorithm: fixed_window, limit: 1, window: 1500ms}, "
        "{name: d, algorithm: fixed_window, limit: 1, window: 2d}, "
        '{name: e, algorithm: token_bucket, rate: "10/s", burst: 1}, '
        '{name: f, algorithm: token_bucket, rate: "5/10s", burst: 1}, '
        '{name: g, algorithm: gcra, rate: "600/m", burst: 1}')))
    p = get_policy(d)
    lims = {l["name"]: l for r in p["routes"] if r["name"] == "api" for l in r["limits"]}
    assert [lims[n]["window"] for n in "abcd"] == ["1h", "90s", "1500ms", "2d"], lims
    assert [lims[n]["rate"] for n in "efg"] == ["10/s", "5/10s", "600/m"], lims
    assert p["server"]["idle_timeout"] == "1m" and p["server"]["drain_timeout"] == "5s", p
