"""Forward-auth /check: gateway conventions, route matching, quotas, headers,
deny replies, several limits on one route (SPEC §3.1, §4, §6)."""
import math

import pytest

from helpers import avoid_hour_boundary  # noqa: F401  (autouse)
from helpers import (all_keys, check, has_rl_headers, policy, rkey, shared_daemon, vcheck)

# HEAD before GET: a GET route takes HEAD too (test_a_get_route_takes_head)
METHODS = ["HEAD", "GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"]


def fw(limit, name="q", window="1h"):
    return "{name: %s, algorithm: fixed_window, limit: %d, window: %s}" % (name, limit, window)


def tb(burst, rate, name="b"):
    return '{name: %s, algorithm: token_bucket, rate: "%s", burst: %d}' % (name, rate, burst)


def route(name, match, limits, key="ip", extra=""):
    return ("  - name: %s\n    match: %s\n    key: %s\n%s    limits: [%s]\n"
            % (name, match, key, extra, ", ".join(limits)))


def limit_of(resp):
    return int(resp.headers["X-RateLimit-Limit"])


def remaining_of(resp):
    return int(resp.headers["X-RateLimit-Remaining"])


def redis_now(redis_server):
    s, us = redis_server.client().time()
    return s + us / 1e6


# ---------------------------------------------------------------- conventions

CONV = policy(
    route("nginx", "{prefix: /n/, methods: [POST]}", [fw(3)])
    + route("hosted", "{prefix: /h/, host: api.example.com, methods: [DELETE]}", [fw(4)])
    + route("catch", "{prefix: /}", [fw(1000)]))


def test_nginx_original_uri_and_method(start_daemon, redis_server):
    d = start_daemon(CONV)
    h = {"X-Original-URI": "/n/items?id=1", "X-Original-Method": "POST"}
    for left in (2, 1, 0):
        r = check(d, "/check", "GET", h)
        assert r.status_code == 200, r.text
        assert limit_of(r) == 3
        assert remaining_of(r) == left
    r = check(d, "/check", "GET", h)
    assert r.status_code == 429
    assert rkey("nginx", "127.0.0.1", "q", "fixed_window") in all_keys(redis_server.client())
    # the same URI with the original method GET is another route
    r = check(d, "/check", "GET", {"X-Original-URI": "/n/items", "X-Original-Method": "GET"})
    assert r.status_code == 200 and limit_of(r) == 1000


def test_traefik_forwarded_headers(start_daemon, redis_server):
    d = start_daemon(CONV)
    h = {"X-Forwarded-Uri": "/h/x", "X-Forwarded-Method": "DELETE",
         "X-Forwarded-Host": "api.example.com", "X-Forwarded-For": "203.0.113.9",
         "X-Forwarded-Proto": "https", "X-Forwarded-Port": "443"}
    for left in (3, 2, 1, 0):
        r = check(d, "/check", "GET", h)
        assert r.status_code == 200
        assert limit_of(r) == 4 and remaining_of(r) == left
    assert check(d, "/check", "GET", h).status_code == 429
    keys = all_keys(redis_server.client())
    assert rkey("hosted", "203.0.113.9", "q", "fixed_window") in keys
    assert rkey("hosted", "127.0.0.1", "q", "fixed_window") not in keys
    # another client behind the same proxy has its own count
    h2 = dict(h, **{"X-Forwarded-For": "203.0.113.10"})
    r = check(d, "/check", "GET", h2)
    assert r.status_code == 200 and remaining_of(r) == 3


def test_traefik_wrong_host_is_other_route(start_daemon):
    d = start_daemon(CONV)
    h = {"X-Forwarded-Uri": "/h/x", "X-Forwarded-Method": "DELETE",
         "X-Forwarded-Host": "other.example.com"}
    r = check(d, "/check", "GET", h)
    assert r.status_code == 200 and limit_of(r) == 1000


def test_envoy_path_prefix_and_method(start_daemon, redis_server):
    d = start_daemon(CONV)
    for left in (3, 2, 1, 0):
        r = check(d, "/check/h/resource", "DELETE", {"Host": "api.example.com"})
        assert r.status_code == 200
        assert limit_of(r) == 4 and remaining_of(r) == left
    r = check(d, "/check/h/resource", "DELETE", {"Host": "api.example.com"})
    assert r.status_code == 429
    # Envoy keeps the original method: GET on the same path is the catch-all
    r = check(d, "/check/h/resource", "GET", {"Host": "api.example.com"})
    assert r.status_code == 200 and limit_of(r) == 1000
    # POST /check/n/x is the nginx route via the path convention
    r = check(d, "/check/n/x", "POST")
    assert r.status_code == 200 and limit_of(r) == 3


def test_bare_check_is_root_path(start_daemon):
    d = start_daemon(policy(route("root", "{path: /}", [fw(7)])))
    r = check(d, "/check")
    assert r.status_code == 200 and limit_of(r) == 7
    r = check(d, "/check/")
    assert r.status_code == 200 and limit_of(r) == 7


def test_header_precedence(start_daemon):
    d = start_daemon(CONV)
    # X-Original-URI beats X-Forwarded-Uri beats the request path
    r = check(d, "/check/zzz", "POST", {"X-Original-URI": "/n/a", "X-Forwarded-Uri": "/zzz"})
    assert limit_of(r) == 3
    r = check(d, "/check/zzz", "POST", {"X-Forwarded-Uri": "/n/a"})
    assert limit_of(r) == 3
    # X-Original-Method beats X-Forwarded-Method beats the request method
    r = check(d, "/check/n/a", "GET", {"X-Original-Method": "POST", "X-Forwarded-Method": "GET"})
    assert limit_of(r) == 3
    r = check(d, "/check/n/a", "GET", {"X-Forwarded-Method": "POST"})
    assert limit_of(r) == 3
    r = check(d, "/check/n/a", "POST", {"X-Original-Method": "GET"})
    assert limit_of(r) == 1000
    # X-Forwarded-Host beats Host
    r = check(d, "/check/h/a", "DELETE", {"Host": "other.example.com",
                                          "X-Forwarded-Host": "api.example.com"})
    assert limit_of(r) == 4
    r = check(d, "/check/h/a", "DELETE", {"Host": "api.example.com",
                                          "X-Forwarded-Host": "other.example.com"})
    assert limit_of(r) == 1000


def test_forwarded_host_list_counts_by_its_first(start_daemon):
    """A proxy that appends (Apache's mod_proxy) sends the client's host
    first in a comma list; the same hosts on separate lines count by the
    first line already (RFC 9110 5.3: the two are one field)."""
    d = start_daemon(CONV)
    for fwd in ("api.example.com, proxy.internal", "api.example.com:443,x",
                "api.example.com ,"):
        r = check(d, "/check/h/a", "DELETE", {"Host": "other.example.com",
                                              "X-Forwarded-Host": fwd})
        assert limit_of(r) == 4, (fwd, r.headers)
    r = check(d, "/check/h/a", "DELETE", {"X-Forwarded-Host": "proxy.internal, api.example.com"})
    assert limit_of(r) == 1000
    # An empty element ahead of the first host is skipped, as in
    # X-Forwarded-For, not taken for an empty host.
    r = check(d, "/check/h/a", "DELETE", {"Host": "other.example.com",
                                          "X-Forwarded-Host": ", api.example.com"})
    assert limit_of(r) == 4, r.headers


def test_an_absolute_request_line_names_the_host(start_daemon):
    """RFC 9112 3.2.2: a request line in absolute form names the host, in
    place of the Host header (nginx's $host reads it so); before, the host
    was dropped and Host counted. X-Forwarded-Host, which a proxy sets to
    say the host, still comes first. An absolute X-Original-URI (which no
    gateway writes: nginx's $request_uri never has the authority) names
    no host: a gateway may pass its client's own header through."""
    from helpers import raw_http, status_of
    d = start_daemon(CONV)

    def head_limit(target, headers=b""):
        out = raw_http(d.port, b"DELETE " + target + b" HTTP/1.1\r\nHost: other.example.com\r\n"
                       + headers + b"Connection: close\r\n\r\n")
        assert status_of(out) in (200, 429), out[:200]  # "hosted" allows 4
        return int(out.split(b"X-RateLimit-Limit: ")[1].split(b"\r\n")[0])

    for target in (b"http://api.example.com/check/h/a", b"HTTP://API.example.com:8443/check/h/a",
                   b"https://user:pw@api.example.com/check/h/a?x=1"):
        assert head_limit(target) == 4, target
    assert head_limit(b"http://api.example.com/check/h/a",
                      b"X-Forwarded-Host: other.example.com\r\n") == 1000
    assert head_limit(b"/check/h/a") == 1000
    # The request line's host stands for Host whichever header the path
    # comes from ...
    assert head_limit(b"http://api.example.com/check", b"X-Original-URI: /h/a\r\n") == 4
    # ... and an absolute X-Original-URI gives its path only.
    assert head_limit(b"/check", b"X-Original-URI: http://api.example.com/h/a\r\n") == 1000
    r = check(d, "/check", "DELETE", {"Host": "api.example.com",
                                      "X-Original-URI": "http://other.example.com/h/a"})
    assert limit_of(r) == 4, r.headers
    # /v1/check: an absolute "path" is the described request's line
    r = vcheck(d, {"path": "http://api.example.com/h/a", "method": "DELETE",
                   "headers": {"Host": "other.example.com"}})
    assert r.json()["limits"][0]["limit"] == 4, r.text
    r = vcheck(d, {"path": "http://api.example.com/h/a", "method": "DELETE",
                   "host": "other.example.com"})
    assert r.json()["limits"][0]["limit"] == 1000, r.text
    r = vcheck(d, {"method": "DELETE", "headers": {
        "Host": "other.example.com", "X-Original-URI": "http://api.example.com/h/a"}})
    assert r.json()["limits"][0]["limit"] == 1000, r.text


def test_a_get_route_takes_head(start_daemon):
    """HEAD is GET without the body, served by the same handler: a limit
    on GET that HEAD stepped around would limit nothing."""
    d = start_daemon(policy(route("reads", "{prefix: /r/, methods: [GET]}", [fw(2)])
                            + route("catch", "{prefix: /}", [fw(1000)])))
    for method, left in (("HEAD", 1), ("GET", 0)):
        r = check(d, "/check/r/x", "GET", {"X-Original-Method": method})
        assert limit_of(r) == 2 and remaining_of(r) == left, (method, r.headers)
    r = check(d, "/check/r/x", "HEAD")
    assert r.status_code == 429
    r = check(d, "/check/r/x", "OPTIONS")
    assert r.status_code == 200 and limit_of(r) == 1000


def test_empty_forwarding_header_counts_as_absent(start_daemon):
    """A header sent empty is no source: the next one in the table is read,
    as for key sources, instead of resolving no path, method or host."""
    d = start_daemon(CONV)
    r = check(d, "/check/zzz", "GET", {"X-Original-URI": "", "X-Forwarded-Uri": "/n/a",
                                       "X-Original-Method": "", "X-Forwarded-Method": "POST"})
    assert limit_of(r) == 3
    from helpers import raw_http, status_of
    out = raw_http(d.port, b"POST /check/n/a HTTP/1.1\r\nHost: x\r\nX-Original-URI:\r\n"
                   b"X-Original-Method:   \r\nConnection: close\r\n\r\n")
    assert status_of(out) == 200 and b"X-RateLimit-Limit: 3\r\n" in out, out
    r = check(d, "/check/h/a", "DELETE", {"Host": "api.example.com", "X-Forwarded-Host": ""})
    assert limit_of(r) == 4


@pytest.mark.parametrize("header", ["X-Original-Method", "X-Forwarded-Method"])
def test_a_method_header_that_is_no_method_is_400(start_daemon, header):
    """A gateway config that writes "$request_method $uri" into the method
    header would match no route's methods and pass every request unlimited,
    unseen. It is refused, naming the header, as /v1/check's "method"."""
    d = start_daemon(CONV)
    for bad in ("P OST", "POST,GET", "GET/1"):
        r = check(d, "/check/n/a", "GET", {header: bad})
        assert r.status_code == 400, (bad, r.status_code, r.text)
        assert r.json() == {"error": "header %s is not an HTTP method "
                            "(a token, such as GET)" % header}, r.text
        assert "X-RateLimit-Limit" not in r.headers
    r = check(d, "/check/n/a", "GET", {header: "POST"})
    assert r.status_code == 200 and limit_of(r) == 3


def test_two_host_headers_are_400(start_daemon):
    """Which one would name the route? Neither: RFC 9112 3.2, as nginx."""
    from helpers import raw_http, status_of
    d = start_daemon(CONV)
    out = raw_http(d.port, b"DELETE /check/h/a HTTP/1.1\r\nHost: other.example.com\r\n"
                   b"Host: api.example.com\r\nConnection: close\r\n\r\n")
    assert status_of(out) == 400 and b"more than one Host header" in out, out


METHOD_POLICY = policy("".join(
    route("m%s" % m.lower(), "{prefix: /m/, methods: [%s]}" % m, [fw(11 + i)])
    for i, m in enumerate(METHODS)))


@pytest.fixture(scope="module")
def method_daemon(tmp_path_factory):
    yield from shared_daemon(tmp_path_factory, METHOD_POLICY)


@pytest.mark.parametrize("method", METHODS)
def test_every_method_all_conventions(method_daemon, method):
    d = method_daemon[0]   # one route per method: the cases do not interfere
    quota = 11 + METHODS.index(method)
    # Envoy: the check request carries the original method
    r = check(d, "/check/m/x", method)
    assert r.status_code == 200 and limit_of(r) == quota
    assert remaining_of(r) == quota - 1
    # nginx: any method on /check, original in X-Original-Method
    r = check(d, "/check", "GET", {"X-Original-URI": "/m/x", "X-Original-Method": method})
    assert r.status_code == 200 and limit_of(r) == quota
    assert remaining_of(r) == quota - 2
    # Traefik: GET with X-Forwarded-Method
    r = check(d, "/check", "GET", {"X-Forwarded-Uri": "/m/x", "X-Forwarded-Method": method})
    assert r.status_code == 200 and limit_of(r) == quota
    assert remaining_of(r) == quota - 3
    # direct call of /check itself with the method (path resolves to "/": no route)
    r = check(d, "/check", method)
    assert r.status_code == 200 and not has_rl_headers(r)


def test_method_not_listed_is_no_match(start_daemon):
    d = start_daemon(policy(route("posts", "{prefix: /p/, methods: [POST]}", [fw(1)])))
    for m in ("GET", "PUT", "DELETE", "HEAD"):
        r = check(d, "/check/p/x", m)
        assert r.status_code == 200 and not has_rl_headers(r), m


# ---------------------------------------------------------------- routes

ROUTES = policy(
    route("exact", "{path: /exact}", [fw(21)])
    + route("pre", "{prefix: /pre/}", [fw(22)])
    + route("rx", "{regex: '^/v[0-9]+/items$'}", [fw(23)])
    + route("host", "{prefix: /hosted/, host: api.example.com}", [fw(24)])
    + route("first", "{prefix: /both/}", [fw(25)])
    + route("second", "{prefix: /both/x}", [fw(26)]))


@pytest.fixture(scope="module")
def routes_daemon(tmp_path_factory):
    yield from shared_daemon(tmp_path_factory, ROUTES)


@pytest.mark.parametrize("path,quota", [
    ("/exact", 21), ("/exact?x=1", 21),
    ("/pre/", 22), ("/pre/a/b", 22), ("/pre/a?q=1", 22),
    ("/v1/items", 23), ("/v22/items", 23), ("/v3/items?page=2", 23),
    ("/both/x", 25), ("/both/xyz", 25),
    # %2F is a slash, as nginx decodes it before choosing a location
    ("/pre%2Fa", 22), ("/x/..%2Fexact", 21), ("/pre%2F..%2Fexact", 21),
    ("/v1%2Fitems", 23),
    ("/exact/", None), ("/exactly", None), ("/exact/x", None),
    ("/pre", None), ("/prefix", None), ("/PRE/a", None),
    ("/vx/items", None), ("/v1/items/x", None), ("/a/v1/items", None),
    ("/nothing", None), ("/", None),
])
def test_route_matching(routes_daemon, path, quota):
    d = routes_daemon[0]
    for r in (check(d, "/check", "GET", {"X-Original-URI": path}),
              check(d, "/check" + path, "GET")):
        assert r.status_code == 200
        if quota is None:
            assert not has_rl_headers(r), r.headers
            assert r.content == b""
        else:
            assert limit_of(r) == quota


def test_route_host(start_daemon):
    d = start_daemon(ROUTES)
    r = check(d, "/check/hosted/a", "GET", {"Host": "api.example.com"})
    assert limit_of(r) == 24
    r = check(d, "/check/hosted/a", "GET", {"Host": "www.example.com"})
    assert r.status_code == 200 and not has_rl_headers(r)
    r = check(d, "/check", "GET", {"X-Original-URI": "/hosted/a",
                                   "X-Forwarded-Host": "api.example.com"})
    assert limit_of(r) == 24
    # host names are case-insensitive
    r = check(d, "/check/hosted/a", "GET", {"Host": "API.Example.COM"})
    assert r.status_code == 200 and limit_of(r) == 24


@pytest.mark.parametrize("want,host,matches", [
    ("api.example.com.", "api.example.com", True),      # root dot in the policy
    ("api.example.com.", "api.example.com.:80", True),
    ("api.example.com:8443", "API.example.com.:8443", True),
    ("api.example.com:8443", "api.example.com:443", False),
    ("api.example.com:8443", "api.example.com", False),
    ("'[::1]'", "[::1]:8080", True),                     # a port the policy did not name
    ("'::1'", "[::1]:8080", True),
    ("'[::1]:8080'", "[::1]:8080", True),
    ("'[::1]:8080'", "[::1]:9090", False),
    ("'[::1]'", "[::2]", False),
    ("api_1.internal", "api_1.internal:81", True),
    # a port is a number: ":08443" reaches the server on 8443, so it must
    # not step around a route that names the port (compared as text, it did)
    ("api.example.com:8443", "api.example.com:08443", True),
    ("api.example.com:8443", "api.example.com:0008443", True),
    ("api.example.com:8443", "api.example.com:84430", False),
    ("'[::1]:8080'", "[::1]:08080", True),
    ("api.example.com:80", "api.example.com:0", False),
    # an IPv6 host is an address however spelled (a review found these
    # compared as text: another route, unlimited)
    ("'[2001:db8::1]:8080'", "[2001:db8:0::1]:8080", True),
    ("'[2001:db8::1]:8080'", "[2001:DB8::0.0.0.1]:08080", True),
    ("'2001:db8::1'", "[2001:0db8::1]", True),
    ("'[2001:db8::1]'", "[2001:db8::2]", False),
])
def test_host_forms(start_daemon, want, host, matches):
    """A route's host and the request's compare as name and port: the
    brackets of an IPv6 literal and a root dot are spelling. A policy host
    with its root dot, or "[::1]" against a Host with a port, never
    matched (found by an audit)."""
    d = start_daemon(policy(route("h", "{prefix: /, host: %s}" % want, [fw(7)])))
    r = check(d, "/check/x", "GET", {"Host": host})
    assert (limit_of(r) == 7 if matches else not has_rl_headers(r)), (want, host, r.headers)


def test_no_route_is_not_counted(start_daemon, redis_server):
    d = start_daemon(ROUTES)
    for _ in range(5):
        r = check(d, "/check/nothing")
        assert r.status_code == 200 and not has_rl_headers(r) and r.content == b""
    assert all_keys(redis_server.client()) == set()


# ---------------------------------------------------------------- quotas

def test_fixed_window_exact_quota_and_headers(start_daemon, redis_server):
    d = start_daemon(policy(route("fw", "{prefix: /}", [fw(5)])))
    for left in range(4, -1, -1):
        r = check(d, "/check/a")
        assert r.status_code == 200
        assert r.content == b""
        assert limit_of(r) == 5 and remaining_of(r) == left
        assert "Retry-After" not in r.headers
        now = redis_now(redis_server)
        to_end = 3600 - (now % 3600)
        reset = int(r.headers["X-RateLimit-Reset"])
        assert 1 <= reset <= 3600
        assert abs(reset - math.ceil(to_end)) <= 2, (reset, to_end)
    for _ in range(3):
        r = check(d, "/check/a")
        assert r.status_code == 429
        assert limit_of(r) == 5 and remaining_of(r) == 0
        ra = int(r.headers["Retry-After"])
        now = redis_now(redis_server)
        assert 1 <= ra <= 3600
        assert abs(ra - math.ceil(3600 - now % 3600)) <= 2
        assert r.headers["Content-Type"].startswith("application/json")
        body = r.json()
        assert set(body) == {"error", "route", "retry_after"}
        assert body["error"] == "rate_limited" and body["route"] == "fw"
        assert isinstance(body["retry_after"], int) and body["retry_after"] >= 1
        assert abs(body["retry_after"] - ra) <= 1


def test_token_bucket_exact_quota_and_headers(start_daemon):
    d = start_daemon(policy(route("tb", "{prefix: /}", [tb(4, "1/h")])))
    for used in range(1, 5):
        r = check(d, "/check/a")
        assert r.status_code == 200
        assert limit_of(r) == 4 and remaining_of(r) == 4 - used
        # back to full after `used` tokens at one per hour
        reset = int(r.headers["X-RateLimit-Reset"])
        assert abs(reset - used * 3600) <= 2, reset
        assert "Retry-After" not in r.headers
    r = check(d, "/check/a")
    assert r.status_code == 429
    assert limit_of(r) == 4 and remaining_of(r) == 0
    ra = int(r.headers["Retry-After"])
    assert 3590 <= ra <= 3600, ra
    assert abs(int(r.headers["X-RateLimit-Reset"]) - 4 * 3600) <= 2
    assert r.json()["route"] == "tb"
    assert abs(r.json()["retry_after"] - ra) <= 1


def test_token_bucket_refills_continuously(start_daemon):
    import time
    d = start_daemon(policy(route("tb", "{prefix: /}", [tb(2, "10/s")])))
    assert check(d, "/check/a").status_code == 200
    assert check(d, "/check/a").status_code == 200
    r = check(d, "/check/a")
    assert r.status_code == 429
    assert r.headers["Retry-After"] == "1"
    assert r.headers["X-RateLimit-Reset"] == "1"
    time.sleep(0.15)   # 1.5 tokens: sub-second refill
    r = check(d, "/check/a")
    assert r.status_code == 200 and remaining_of(r) == 0
    assert check(d, "/check/a").status_code == 429


def test_deny_status_default_is_429(start_daemon):
    d = start_daemon(policy(route("r", "{prefix: /}", [fw(1)])))
    assert check(d, "/check/x").status_code == 200
    assert check(d, "/check/x").status_code == 429


def test_deny_status_server_and_route_override(start_daemon):
    d = start_daemon(policy(
        route("srv", "{prefix: /s/}", [fw(1)])
        + route("own", "{prefix: /o/}", [fw(1)], extra="    deny_status: 429\n"),
        server="  deny_status: 403\n"))
    assert check(d, "/check/s/x").status_code == 200
    r = check(d, "/check/s/x")
    assert r.status_code == 403
    assert r.json() == {"error": "rate_limited", "route": "srv",
                        "retry_after": r.json()["retry_after"]}
    assert int(r.headers["Retry-After"]) >= 1
    assert check(d, "/check/o/x").status_code == 200
    r = check(d, "/check/o/x")
    assert r.status_code == 429 and r.json()["route"] == "own"


def test_deny_status_route_override_of_default(start_daemon):
    d = start_daemon(policy(route("own", "{prefix: /}", [fw(1)],
                                  extra="    deny_status: 403\n")))
    assert check(d, "/check/x").status_code == 200
    r = check(d, "/check/x")
    assert r.status_code == 403 and r.json()["error"] == "rate_limited"


# ---------------------------------------------------------------- several limits

@pytest.mark.parametrize("order", ["bucket_first", "window_first"])
def test_several_limits_all_or_nothing(start_daemon, redis_server, order):
    lims = [tb(5, "1/h", name="wide"), fw(2, name="narrow")]
    if order == "window_first":
        lims.reverse()
    d = start_daemon(policy(route("multi", "{prefix: /}", lims)))
    rc = redis_server.client()
    kw = rkey("multi", "127.0.0.1", "wide", "token_bucket")
    kn = rkey("multi", "127.0.0.1", "narrow", "fixed_window")
    for left in (1, 0):
        r = check(d, "/check/a")
        assert r.status_code == 200
        assert limit_of(r) == 2 and remaining_of(r) == left
    assert {kw, kn} <= all_keys(rc)
    before = (rc.dump(kw), rc.dump(kn))
    for _ in range(3):
        r = check(d, "/check/a")
        assert r.status_code == 429
        assert limit_of(r) == 2 and remaining_of(r) == 0
    assert (rc.dump(kw), rc.dump(kn)) == before, "a denied request charged a limit"
    # what the daemon reports agrees: the wide limit still has 3 left
    # (this /v1/check is itself denied, so charges nothing)
    v = vcheck(d, {"route": "multi", "key": "127.0.0.1"}).json()
    assert v["allowed"] is False
    wide = [l for l in v["limits"] if l["name"] == "wide"][0]
    narrow = [l for l in v["limits"] if l["name"] == "narrow"][0]
    assert wide["remaining"] == 3 and wide["allowed"] is True
    assert narrow["remaining"] == 0 and narrow["allowed"] is False
    assert (rc.dump(kw), rc.dump(kn)) == before


def test_headers_from_limit_closest_to_exhaustion(start_daemon):
    d = start_daemon(policy(route("m", "{prefix: /}",
                                  [fw(10, name="big"), fw(3, name="small"), fw(6, name="mid")])))
    for left in (2, 1, 0):
        r = check(d, "/check/a")
        assert r.status_code == 200
        assert limit_of(r) == 3 and remaining_of(r) == left
    r = check(d, "/check/a")
    assert r.status_code == 429 and limit_of(r) == 3 and remaining_of(r) == 0


@pytest.mark.parametrize("order", ["long_first", "long_second"])
def test_headers_tie_takes_longest_reset(start_daemon, order):
    lims = [tb(5, "5/h", name="slow"), tb(5, "5/s", name="fast")]
    if order == "long_second":
        lims.reverse()
    d = start_daemon(policy(route("m", "{prefix: /}", lims)))
    r = check(d, "/check/a")
    assert r.status_code == 200
    assert limit_of(r) == 5 and remaining_of(r) == 4
    # slow: one token back after 3600/5 = 720 s; fast: after 0.2 s (1 s)
    reset = int(r.headers["X-RateLimit-Reset"])
    assert 718 <= reset <= 720, reset


def test_check_does_not_reply_json_when_allowed(start_daemon):
    d = start_daemon(policy(route("r", "{prefix: /}", [fw(3)])))
    r = check(d, "/check/a", "POST", data=b"some body the gateway forwarded")
    assert r.status_code == 200 and r.content == b""
    assert remaining_of(r) == 2


def test_fixed_window_rolls_over(start_daemon, redis_server):
    import time
    d = start_daemon(policy(route("fw1", "{prefix: /}", [fw(2, window="1s")])))
    # start just after a second boundary (Redis time) so the window is ours
    now = redis_now(redis_server)
    time.sleep(1.02 - (now % 1))
    assert check(d, "/check/a").status_code == 200
    assert check(d, "/check/a").status_code == 200
    r = check(d, "/check/a")
    assert r.status_code == 429 and r.headers["Retry-After"] == "1"
    now = redis_now(redis_server)
    time.sleep(1.02 - (now % 1))
    r = check(d, "/check/a")
    assert r.status_code == 200, "a denial outlived its window"
    assert remaining_of(r) == 1
