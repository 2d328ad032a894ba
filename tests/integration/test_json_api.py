"""POST /v1/check (SPEC §3.2)."""
import json
import time

import pytest
import requests

from helpers import avoid_hour_boundary  # noqa: F401  (autouse)
from helpers import all_keys, has_rl_headers, policy, rkey, rkey_ip, shared_daemon, vcheck

JSON_POLICY = policy(
    "  - name: api\n"
    "    match: {prefix: /api/, host: api.example.com}\n"
    "    key: [header:X-Api-Key, ip]\n"
    "    limits:\n"
    '      - {name: burst, algorithm: token_bucket, rate: "1/h", burst: 5}\n'
    "      - {name: hourly, algorithm: fixed_window, limit: 10, window: 1h}\n"
    "  - name: byip\n"
    "    match: {prefix: /ip/}\n"
    "    key: ip\n"
    "    limits: [{name: q, algorithm: fixed_window, limit: 3, window: 1h}]\n"
    "  - name: single\n"
    "    match: {prefix: /s/}\n"
    "    key: header:K\n"
    "    deny_status: 403\n"
    "    limits: [{name: q, algorithm: fixed_window, limit: 5, window: 1h}]\n")

TOP = {"allowed", "route", "key", "limit", "remaining", "reset", "retry_after",
       "degraded", "limits"}
PER_LIMIT = {"name", "algorithm", "limit", "remaining", "reset", "allowed"}


def is_int(x):
    return isinstance(x, int) and not isinstance(x, bool)


def test_name_form_reply_fields(start_daemon):
    d = start_daemon(JSON_POLICY)
    r = vcheck(d, {"route": "api", "key": "k1", "cost": 1})
    assert r.status_code == 200, r.text
    assert r.headers["Content-Type"].startswith("application/json")
    v = r.json()
    assert set(v) == TOP
    assert v["allowed"] is True and v["degraded"] is False
    assert v["route"] == "api" and v["key"] == "k1"
    for f in ("limit", "remaining", "reset", "retry_after"):
        assert is_int(v[f]), f
    assert v["limit"] == 5 and v["remaining"] == 4 and v["retry_after"] == 0
    assert abs(v["reset"] - 3600) <= 2
    assert [set(l) for l in v["limits"]] == [PER_LIMIT, PER_LIMIT]
    burst, hourly = v["limits"]
    assert burst["name"] == "burst" and burst["algorithm"] == "token_bucket"
    assert burst["limit"] == 5 and burst["remaining"] == 4 and burst["allowed"] is True
    assert abs(burst["reset"] - 3600) <= 2
    assert hourly["name"] == "hourly" and hourly["algorithm"] == "fixed_window"
    assert hourly["limit"] == 10 and hourly["remaining"] == 9 and hourly["allowed"] is True
    assert 1 <= hourly["reset"] <= 3600
    # headers are those of the top level
    assert r.headers["X-RateLimit-Limit"] == "5"
    assert r.headers["X-RateLimit-Remaining"] == "4"
    assert int(r.headers["X-RateLimit-Reset"]) == v["reset"]
    assert "Retry-After" not in r.headers


def test_cost_defaults_to_one(start_daemon):
    d = start_daemon(JSON_POLICY)
    assert vcheck(d, {"route": "single", "key": "a"}).json()["remaining"] == 4
    assert vcheck(d, {"route": "single", "key": "a"}).json()["remaining"] == 3


def test_describe_form(start_daemon, redis_server):
    d = start_daemon(JSON_POLICY)
    body = {"method": "GET", "path": "/api/users?id=1", "host": "api.example.com",
            "ip": "203.0.113.7", "headers": {"X-Api-Key": "k1"}, "cost": 1}
    r = vcheck(d, body)
    assert r.status_code == 200
    v = r.json()
    assert v["route"] == "api" and v["key"] == "k1" and v["remaining"] == 4
    # without the header the ip is the key (fallback list)
    del body["headers"]
    v = vcheck(d, body).json()
    assert v["route"] == "api" and v["key"] == "203.0.113.7"
    # the same client through the name form shares the counter
    v = vcheck(d, {"route": "api", "key": "k1"}).json()
    assert v["remaining"] == 3
    assert all_keys(redis_server.client()) == {
        rkey("api", "k1", "burst", "token_bucket"), rkey("api", "k1", "hourly", "fixed_window"),
        rkey_ip("api", "203.0.113.7", "burst", "token_bucket"),
        rkey_ip("api", "203.0.113.7", "hourly", "fixed_window")}


def test_describe_form_ip_is_client_ip(start_daemon, redis_server):
    d = start_daemon(JSON_POLICY)
    for left in (2, 1, 0):
        v = vcheck(d, {"method": "POST", "path": "/ip/x", "ip": "198.51.100.3"}).json()
        assert v["allowed"] is True and v["key"] == "198.51.100.3" and v["remaining"] == left
    r = vcheck(d, {"method": "POST", "path": "/ip/x", "ip": "198.51.100.3"})
    assert r.status_code == 429 and r.json()["allowed"] is False
    v = vcheck(d, {"method": "POST", "path": "/ip/x", "ip": "198.51.100.4"}).json()
    assert v["allowed"] is True and v["remaining"] == 2
    assert rkey("byip", "198.51.100.3", "q", "fixed_window") in all_keys(redis_server.client())


def test_named_address_on_an_ip_route_is_that_client(start_daemon, redis_server):
    """On a route keyed by ip alone, a named key that is an address is the
    client /check sees at that address, however spelled: its bucket and
    its override. It was matched against overrides as written, so the
    bucket /check limited at 1 took 3 by name, and an exempt address
    named canonically was charged."""
    d = start_daemon(policy(
        "  - name: byip\n"
        "    match: {prefix: /ip/}\n"
        "    key: ip\n"
        "    limits: [{name: q, algorithm: fixed_window, limit: 3, window: 1h}]\n"
        "    overrides:\n"
        '      - {keys: ["::ffff:10.9.9.9"], limits: [{name: q, algorithm: fixed_window,'
        " limit: 1, window: 1h}]}\n"
        '      - {keys: ["2001:DB8::1"], unlimited: true}\n'))
    r = vcheck(d, {"route": "byip", "key": "10.9.9.9"})
    assert r.status_code == 200 and r.json()["limit"] == 1, r.text
    r = vcheck(d, {"route": "byip", "key": "::FFFF:10.9.9.9"})
    assert r.status_code == 429 and r.json()["key"] == "10.9.9.9", r.text
    r = vcheck(d, {"method": "GET", "path": "/ip/x", "ip": "10.9.9.9"})
    assert r.status_code == 429, r.text
    for spelled in ("2001:db8::1", "2001:db8:0::1"):
        v = vcheck(d, {"route": "byip", "key": spelled}).json()
        assert v.get("unlimited") is True, v
    # not an address: a value, as before
    assert vcheck(d, {"route": "byip", "key": "unix"}).json()["limit"] == 3
    # nor is an address followed by a NUL: not the address's client
    v = vcheck(d, {"route": "byip", "key": "10.9.9.9\u0000x"}).json()
    assert v["limit"] == 3 and v["key"] == "10.9.9.9\u0000x", v
    assert all_keys(redis_server.client()) == {
        rkey("byip", "10.9.9.9", "q", "fixed_window"),
        rkey("byip", "unix", "q", "fixed_window"),
        rkey("byip", "10.9.9.9\u0000x", "q", "fixed_window")}


def test_key_without_route_is_400(start_daemon):
    """The describe form resolves the client itself: a `key` beside it was
    ignored, and the caller charged another bucket than it named."""
    d = start_daemon(JSON_POLICY)
    r = vcheck(d, {"method": "GET", "path": "/s/x", "headers": {"K": "a"}, "key": "b"})
    assert r.status_code == 400 and "\"key\" needs \"route\"" in r.json()["error"], r.text


def test_route_named_client_described(start_daemon, redis_server):
    """With `route` and no `key`, the client is resolved from `ip`,
    `headers` or `path` by that route's `key`, as /check would, with no
    route matching: the same bucket as /check's or the key named."""
    d = start_daemon(JSON_POLICY)
    v = vcheck(d, {"route": "byip", "ip": "2001:db8:0:0::7"}).json()
    assert v["key"] == "2001:db8::7" and v["remaining"] == 2, v
    v = vcheck(d, {"route": "byip", "key": "2001:db8::7"}).json()
    assert v["remaining"] == 1, v
    # by header, the path and host of the route not needed
    v = vcheck(d, {"route": "api", "headers": {"x-api-key": "h1"}}).json()
    assert v["key"] == "h1" and v["limits"][1]["remaining"] == 9, v
    v = vcheck(d, {"method": "GET", "path": "/api/x", "host": "api.example.com",
                   "headers": {"X-Api-Key": "h1"}}).json()
    assert v["key"] == "h1" and v["limits"][1]["remaining"] == 8, v
    # the route's fallback to the IP, from the described ip
    v = vcheck(d, {"route": "api", "ip": "198.51.100.9"}).json()
    assert v["key"] == "198.51.100.9", v
    # no source present: the route's missing_key (deny, by default)
    r = vcheck(d, {"route": "single", "headers": {"Other": "x"}})
    assert r.status_code == 403 and r.json()["error"] == "missing_key", r.text
    assert all_keys(redis_server.client()) == {
        rkey("byip", "2001:db8::7", "q", "fixed_window"),
        rkey("api", "h1", "burst", "token_bucket"), rkey("api", "h1", "hourly", "fixed_window"),
        rkey_ip("api", "198.51.100.9", "burst", "token_bucket"),
        rkey_ip("api", "198.51.100.9", "hourly", "fixed_window")}


def test_route_named_needs_one_client(start_daemon):
    d = start_daemon(JSON_POLICY)
    r = vcheck(d, {"route": "byip"})
    assert r.status_code == 400 and "\"key\" is required with \"route\"" in r.json()["error"]
    # a key named wins over a description, as the route named wins over
    # the path's match
    v = vcheck(d, {"route": "single", "key": "a", "ip": "10.0.0.1",
                   "headers": {"K": "b"}, "path": "/api/x"}).json()
    assert v["route"] == "single" and v["key"] == "a", v
    # a bad address is refused whether or not the form goes on to use it
    for body in ({"route": "byip", "ip": "not-an-ip"},
                 {"route": "single", "key": "a", "ip": "not-an-ip"},
                 {"path": "/nowhere-routed", "ip": "10.0.0.1:x"}):
        r = vcheck(d, body)
        assert r.status_code == 400, (body, r.status_code, r.text)
        assert "\"ip\" is not an IP address" in r.json()["error"], (body, r.text)


def test_describe_form_host_must_match(start_daemon):
    d = start_daemon(JSON_POLICY)
    r = vcheck(d, {"method": "GET", "path": "/api/x", "host": "other.example.com",
                   "headers": {"X-Api-Key": "k1"}})
    assert r.status_code == 200
    assert r.json() == {"allowed": True, "route": None}


def test_describe_form_reads_its_headers_as_check_does(start_daemon):
    """Host, method and path left out of the body are read from its
    "headers" as /check reads them from its own; with neither, the method
    is GET and the path /."""
    d = start_daemon(JSON_POLICY + "  - name: posts\n    match: {{path: /, methods: [POST]}}\n"
                     "    key: ip\n    limits: [{{name: q, algorithm: fixed_window, "
                     "limit: 9, window: 1h}}]\n")
    for headers in ({"Host": "api.example.com", "X-Api-Key": "k1"},
                    {"host": "other", "x-forwarded-host": "api.example.com", "X-Api-Key": "k1"}):
        v = vcheck(d, {"path": "/api/x", "headers": headers}).json()
        assert v["route"] == "api" and v["key"] == "k1", (headers, v)
    # the body's own field wins
    v = vcheck(d, {"path": "/api/x", "host": "other.example.com",
                   "headers": {"Host": "api.example.com"}}).json()
    assert v == {"allowed": True, "route": None}
    v = vcheck(d, {"headers": {"X-Original-URI": "/", "X-Original-Method": "POST"}}).json()
    assert v["route"] == "posts"
    assert vcheck(d, {"ip": "192.0.2.1"}).json() == {"allowed": True, "route": None}
    # one name twice, in two cases: which would count? (/check: two Host lines, 400)
    r = vcheck(d, {"path": "/api/x", "headers": {"Host": "other", "host": "api.example.com"}})
    assert r.status_code == 400 and r.json() == {
        "error": 'field "headers" names "Host" twice (header names are case-insensitive)'}, \
        r.text
    # a name no HTTP head could carry: /check would refuse it, and so does
    # this (it was read as some other header, and the key went missing)
    for name, shown in (("X-Api-Key\r\nX", "X-Api-Key\\x0d\\x0aX"), ("", ""),
                        ("X Api Key", "X Api Key"), ("X-Api-Key:", "X-Api-Key:")):
        r = vcheck(d, {"path": "/api/x", "headers": {name: "k1"}})
        assert r.status_code == 400 and r.json() == {
            "error": 'field "headers": "%s" is not a header name' % shown}, (name, r.text)
    assert vcheck(d, {"method": "POST", "ip": "192.0.2.1"}).json()["route"] == "posts"


def test_no_route_reply(start_daemon, redis_server):
    d = start_daemon(JSON_POLICY)
    r = vcheck(d, {"method": "GET", "path": "/nothing/here", "ip": "192.0.2.1"})
    assert r.status_code == 200
    assert r.json() == {"allowed": True, "route": None}
    assert not has_rl_headers(r)
    assert all_keys(redis_server.client()) == set()


def test_cost_and_denial(start_daemon):
    d = start_daemon(JSON_POLICY)
    v = vcheck(d, {"route": "single", "key": "c", "cost": 3}).json()
    assert v["allowed"] is True and v["remaining"] == 2
    r = vcheck(d, {"route": "single", "key": "c", "cost": 3})
    assert r.status_code == 403   # the route's deny_status
    v = r.json()
    assert set(v) == TOP
    assert v["allowed"] is False and v["degraded"] is False
    assert v["remaining"] == 2    # nothing charged on a denial
    assert is_int(v["retry_after"]) and v["retry_after"] >= 1
    assert v["limits"][0]["allowed"] is False and v["limits"][0]["remaining"] == 2
    assert r.headers["X-RateLimit-Remaining"] == "2"
    assert int(r.headers["Retry-After"]) >= 1
    v = vcheck(d, {"route": "single", "key": "c", "cost": 2}).json()
    assert v["allowed"] is True and v["remaining"] == 0


def test_cost_equal_to_quota(start_daemon):
    d = start_daemon(JSON_POLICY)
    r = vcheck(d, {"route": "single", "key": "e", "cost": 5})
    assert r.status_code == 200 and r.json()["remaining"] == 0


def test_cost_between_quotas_is_a_denial_not_an_error(start_daemon):
    d = start_daemon(JSON_POLICY)
    # route api: burst 5, hourly 10. cost 10 is within the largest quota
    r = vcheck(d, {"route": "api", "key": "k", "cost": 10})
    assert r.status_code == 429, r.text
    v = r.json()
    assert v["allowed"] is False
    assert [l["allowed"] for l in v["limits"]] == [False, True]
    assert [l["remaining"] for l in v["limits"]] == [5, 10]


def test_a_cost_above_an_override_names_the_override(start_daemon, redis_server):
    """The 400 said "the largest quota (50) of route api" for a key whose
    override has 50, on a route whose largest is 1000 (an audit): it names
    the quotas the caller is held to."""
    d = start_daemon(policy(
        "  - name: api\n"
        "    match: {prefix: /api/}\n"
        "    key: header:X-Api-Key\n"
        "    limits: [{name: hourly, algorithm: fixed_window, limit: 1000, window: 1h}]\n"
        "    overrides:\n"
        '      - {keys: [partner-1], limits: [{algorithm: gcra, rate: "100/s", burst: 50}]}\n'))
    r = vcheck(d, {"route": "api", "key": "partner-1", "cost": 51})
    assert r.status_code == 400 and r.json()["error"] == (
        'field "cost": 51 is above the largest quota (50) of this key\'s override '
        "on route api"), r.text
    r = vcheck(d, {"route": "api", "key": "k", "cost": 1001})
    assert r.status_code == 400 and r.json()["error"] == (
        'field "cost": 1001 is above the largest quota (1000) of route api'), r.text
    # the override's own bound is the override's: 51 is a check elsewhere
    assert vcheck(d, {"route": "api", "key": "k", "cost": 51}).status_code == 200
    assert all_keys(redis_server.client()) == {rkey("api", "k", "hourly", "fixed_window")}


@pytest.fixture(scope="module")
def json_daemon(tmp_path_factory):
    """Shared by the 400 cases: none of them may count anything."""
    yield from shared_daemon(tmp_path_factory, JSON_POLICY)


def err(r):
    assert r.status_code == 400, (r.status_code, r.text)
    v = r.json()
    assert set(v) == {"error"} and isinstance(v["error"], str) and v["error"]
    return v["error"].lower()


@pytest.mark.parametrize("body", [
    "", "{", "not json", '{"route":"api",}', "{'route':'api'}", '{"route":"api"} x',
    "\xff\xfe", '{"route": "api", "key": "k", "cost": 1',
])
def test_malformed_json_is_400(json_daemon, body):
    d = json_daemon[0]
    err(vcheck(d, body.encode("latin-1")))
    assert requests.get(d.url("/healthz"), timeout=2).text == "ok"


@pytest.mark.parametrize("body", ["[]", "null", "42", '"route"', "true"])
def test_non_object_is_400(json_daemon, body):
    d = json_daemon[0]
    assert "json object" in err(vcheck(d, body))


@pytest.mark.parametrize("body,says", [
    (b"", "empty body"),
    (b'{"method":"GET","path":"/api/a\\u0000b"}', 'field "path" must not contain \\u0000'),
    (b'{"path":"/api/x","headers":{"X-Api-Key":"a\\u0000b"}}',
     'field "headers.x-api-key" must not contain \\u0000'),
    (b'{"path":"/api/x","headers":{"X-Api-Key":"a\\r\\nb"}}',
     'field "headers.x-api-key" must not contain a cr or lf'),
    (b'{"path":"/api/x","headers":{"X-Api-Key":"a\\nb"}}',
     'field "headers.x-api-key" must not contain a cr or lf'),
    (b'{"path":"/api/x","headers":{"X-Api\\u0000":"k"}}', "\\u0000 is not allowed in a field name"),
    (b'{"route":"api","key":"k","cost":99999999999999999999}', "number too big"),
    # jansson quotes the bytes near the error, here not UTF-8: they were a
    # 500, as the reply could not hold them (found by make fuzz)
    (b'{"\\u000\xdf\x93\x90"key":"k1","cost":2}',
     "invalid escape near '\"\\u000\\xdf'"),
    # a misspelt field would otherwise be ignored, and the check counted
    # against what the caller did not mean: refused, named as sent
    (b'{"route":"api","key":"k","costs":2}', 'unknown field "costs"'),
    (b'{"path":"/api/x","header":{"X-Api-Key":"k"}}', 'unknown field "header"'),
    (b'{"route":"api","key":"k","Cost":2}', 'unknown field "cost"'),
])
def test_json_errors_say_what_is_wrong(json_daemon, body, says):
    """In our words, with the position where there is one; never the
    decoder's own flag names."""
    msg = err(vcheck(json_daemon[0], body))
    assert says in msg and "json_" not in msg, msg


@pytest.mark.parametrize("body,field", [
    ({"route": 5, "key": "k"}, "route"),
    ({"route": "api", "key": 5}, "key"),
    ({"route": "api", "key": ["k"]}, "key"),
    ({"route": "api", "key": "k", "cost": "1"}, "cost"),
    ({"route": "api", "key": "k", "cost": 1.5}, "cost"),
    ({"route": "api", "key": "k", "cost": True}, "cost"),
    ({"route": "api", "key": "k", "cost": 0}, "cost"),
    ({"route": "api", "key": "k", "cost": -1}, "cost"),
    ({"route": "api", "key": "k", "cost": 11}, "cost"),
    ({"route": "single", "key": "k", "cost": 6}, "cost"),
    ({"route": "api", "key": "k", "cost": 2 ** 40}, "cost"),
    ({"method": "GET", "path": 5}, "path"),
    ({"method": 5, "path": "/api/x"}, "method"),
    ({"method": "G ET", "path": "/api/x"}, "method"),
    ({"method": "GET\n", "path": "/api/x"}, "method"),
    ({"route": "api", "key": "k", "method": "(GET)"}, "method"),
    ({"method": "GET", "path": "/api/x", "host": 5}, "host"),
    ({"method": "GET", "path": "/api/x", "ip": 5}, "ip"),
    ({"method": "GET", "path": "/api/x", "headers": ["X-Api-Key", "k"]}, "headers"),
    ({"method": "GET", "path": "/api/x", "headers": {"X-Api-Key": 5}}, "header"),
    ({"method": "GET", "path": "/s/x", "headers": {"K": "k"}, "cost": 0}, "cost"),
])
def test_wrong_field_is_400_naming_it(json_daemon, body, field):
    d, rs = json_daemon
    assert field in err(vcheck(d, body))
    assert all_keys(rs.client()) == set()   # nothing in this module's daemon counts


def test_unknown_route_is_400(start_daemon):
    d = start_daemon(JSON_POLICY)
    e = err(vcheck(d, {"route": "nope", "key": "k"}))
    assert "route" in e or "nope" in e


def test_body_over_64k_is_413(start_daemon):
    d = start_daemon(JSON_POLICY)
    base = json.dumps({"route": "single", "key": "big"})
    ok = base + " " * (65536 - len(base))
    assert len(ok) == 65536
    r = vcheck(d, ok)
    assert r.status_code == 200, r.status_code
    big = base + " " * (65537 - len(base))
    r = vcheck(d, big)
    assert r.status_code == 413
    # a client still sending a large body must get the 413 too, not a
    # connection reset (RFC 9112 §9.6: close the write side, then drain)
    for _ in range(5):
        try:
            r = vcheck(d, base + " " * (1 << 20))
        except requests.exceptions.ConnectionError as e:
            raise AssertionError("1 MiB body: connection reset instead of 413: %r" % e)
        assert r.status_code == 413
    assert requests.get(d.url("/healthz"), timeout=2).status_code == 200


def test_deeply_nested_json_is_400(start_daemon):
    d = start_daemon(JSON_POLICY)
    err(vcheck(d, "[" * 20000 + "]" * 20000))
    err(vcheck(d, '{"route":"api","key":"k","x":' + "[" * 20000 + "]" * 20000 + "}"))
    assert requests.get(d.url("/healthz"), timeout=2).status_code == 200


def test_describe_form_without_client_key_is_a_403_verdict(start_daemon):
    """No client key under missing_key: deny: the body /check answers, plus
    the verdict field a JSON client reads first."""
    d = start_daemon(JSON_POLICY)
    r = vcheck(d, {"method": "GET", "path": "/s/x"})
    assert r.status_code == 403, r.text
    assert r.json() == {"allowed": False, "error": "missing_key", "route": "single"}


def test_bad_ip_and_missing_key_are_400(start_daemon):
    d = start_daemon(JSON_POLICY)
    assert "ip" in err(vcheck(d, {"method": "GET", "path": "/ip/x", "ip": "not-an-ip"}))
    assert "key" in err(vcheck(d, {"route": "single"}))
    assert err(vcheck(d, {"route": "single", "key": ""})) == 'field "key" must not be empty'


def test_many_header_names_are_checked_for_twins_without_a_stall(start_daemon):
    """The case-insensitive twin check of `headers` compared every name with
    every other: 7,000 names (a 64 KiB body) held the worker 0.9 s, and
    every check behind it. Sorted, it is a few milliseconds."""
    d = start_daemon(JSON_POLICY)
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    names = {digits[i // 1296] + digits[i // 36 % 36] + digits[i % 36]: ""
             for i in range(6000)}
    body = json.dumps({"path": "/api/x", "headers": names}, separators=(",", ":"))
    assert len(body) < 64 * 1024
    t0 = time.monotonic()
    r = vcheck(d, body)
    took = time.monotonic() - t0
    assert r.status_code == 200, r.text
    assert took < 0.2, took
    names["1AB"] = ""
    r = vcheck(d, json.dumps({"path": "/api/x", "headers": names}, separators=(",", ":")))
    assert r.status_code == 400 and r.json() == {
        "error": 'field "headers" names "1ab" twice (header names are case-insensitive)'}, r.text


def test_path_longer_than_a_check_head_is_refused(start_daemon):
    """A path no gateway could send (/check's head is at most 16 KiB): every
    regex route would scan all of it (1,000 unanchored ones took 0.6 s of
    the worker for a 64 KiB path)."""
    d = start_daemon(JSON_POLICY)
    assert vcheck(d, {"path": "/api/" + "a" * (16384 - 5)}).status_code == 200
    r = vcheck(d, {"path": "/api/" + "a" * 16380})
    assert r.status_code == 400 and r.json() == {
        "error": 'field "path" is longer than 16384 bytes'}, r.text


def test_query_key_that_is_not_utf8(start_daemon):
    """A query value decodes to any bytes: `k=%FF` made the JSON reply's
    `key` a string JSON cannot carry, and the worker crashed building it.
    Such a key is shown percent-encoded, as in its Redis key and the log;
    one that is UTF-8 (a NUL included) is shown as it is. Each is its own
    client, and /check counts the same bucket."""
    d = start_daemon(policy(
        "  - name: q\n"
        "    match: {prefix: /q/}\n"
        "    key: query:k\n"
        "    limits: [{name: q, algorithm: fixed_window, limit: 3, window: 1h}]\n"))
    r = vcheck(d, {"path": "/q/x?k=%FF"})
    assert r.status_code == 200, r.text
    assert r.json()["key"] == "%FF" and r.json()["remaining"] == 2
    r = vcheck(d, {"path": "/q/x?k=caf%C3%A9%00x"})
    assert r.status_code == 200 and r.json()["key"] == "caf\u00e9\u0000x"
    # SPEC 4: any byte may be in a key, so the key shown can be named back
    # (a NUL was refused as malformed JSON), and it is the same client.
    r = vcheck(d, {"route": "q", "key": "caf\u00e9\u0000x"})
    assert r.status_code == 200, r.text
    assert r.json()["key"] == "caf\u00e9\u0000x" and r.json()["remaining"] == 1
    r = vcheck(d, {"route": "q", "key": "\u0000"})
    assert r.status_code == 200 and r.json()["remaining"] == 2, r.text
    r = requests.get(d.url("/check/q/x?k=%FF"), timeout=2)
    assert r.status_code == 200 and r.headers["X-RateLimit-Remaining"] == "1"
    assert requests.get(d.url("/healthz"), timeout=2).status_code == 200


def test_described_forwarding_headers_count_as_check_counts_them(start_daemon):
    """SPEC 3.2: the described request is "resolved exactly like the
    forward-auth check": with no `ip`, its X-Forwarded-For / X-Real-IP in
    `headers` name the client when the caller is a trusted proxy (they
    were ignored, and every such check counted the caller's address)."""
    d = start_daemon(JSON_POLICY)
    v = vcheck(d, {"path": "/ip/x", "headers": {"X-Forwarded-For": "203.0.113.5"}}).json()
    assert v["key"] == "203.0.113.5", v
    v = vcheck(d, {"path": "/ip/x", "headers": {"x-real-ip": "203.0.113.6"}}).json()
    assert v["key"] == "203.0.113.6", v
    # walked right to left past trusted hops, as /check walks them
    v = vcheck(d, {"path": "/ip/x", "headers": {
        "X-Forwarded-For": "198.51.100.1, 203.0.113.7, 127.0.0.1"}}).json()
    assert v["key"] == "203.0.113.7", v
    # `ip`, when given, is the client
    v = vcheck(d, {"path": "/ip/x", "ip": "198.51.100.2",
                   "headers": {"X-Forwarded-For": "203.0.113.5"}}).json()
    assert v["key"] == "198.51.100.2", v


def test_described_forwarding_headers_of_an_untrusted_caller_are_ignored(start_daemon):
    d = start_daemon(JSON_POLICY.replace("routes:\n", "trusted_proxies: [10.0.0.0/8]\nroutes:\n", 1))
    v = vcheck(d, {"path": "/ip/x", "headers": {"X-Forwarded-For": "203.0.113.5"}}).json()
    assert v["key"] == "127.0.0.1", v


def test_reply_key_is_null_when_missing_key_allows(start_daemon):
    d = start_daemon(JSON_POLICY.replace("    key: header:K\n",
                                         "    key: header:K\n    missing_key: allow\n"))
    r = vcheck(d, {"path": "/s/x"})
    assert r.status_code == 200 and r.json()["key"] is None and r.json()["unlimited"] is True, r.text
