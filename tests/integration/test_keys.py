"""Client keys: ip with trusted proxies, header/query/cookie/global, fallback
lists, missing_key, and the Redis key layout for long and odd keys
(SPEC §4, §5; contract: Redis keys)."""
import pytest

from helpers import avoid_hour_boundary  # noqa: F401  (autouse)
from helpers import all_keys, check, has_rl_headers, policy, rkey, rkey_global, rkey_ip, vcheck


def fw(limit, name="q"):
    return "{name: %s, algorithm: fixed_window, limit: %d, window: 1h}" % (name, limit)


def route(name, prefix, key, limit=2, extra=""):
    return ("  - name: %s\n    match: {prefix: %s}\n    key: %s\n%s    limits: [%s]\n"
            % (name, prefix, key, extra, fw(limit)))


KEYS = policy(
    route("ipk", "/ip/", "ip")
    + route("hdr", "/hdr/", "header:X-Api-Key")
    + route("hdr2", "/hdr2/", "header:X-Api-Key")
    + route("qry", "/qry/", "query:k")
    + route("ck", "/ck/", "cookie:sid")
    + route("glob", "/glob/", "global")
    + route("fb", "/fb/", "[header:X-Api-Key, query:k, cookie:sid, ip]")
    + route("fbn", "/fbn/", "[header:X-Api-Key, query:k]")
    + route("md", "/md/", "header:X-Api-Key", extra="    missing_key: deny\n")
    + route("ma", "/ma/", "header:X-Api-Key", extra="    missing_key: allow\n"),
    top="trusted_proxies: [127.0.0.1/32, 10.0.0.0/8]\n")


def remaining(r):
    return int(r.headers["X-RateLimit-Remaining"])


# ---------------------------------------------------------------- ip

@pytest.mark.parametrize("headers,client", [
    ({}, "127.0.0.1"),
    ({"X-Forwarded-For": "203.0.113.5"}, "203.0.113.5"),
    ({"X-Forwarded-For": "198.51.100.1, 203.0.113.5, 10.1.2.3"}, "203.0.113.5"),
    ({"X-Forwarded-For": "198.51.100.1,203.0.113.5,10.1.2.3,10.9.9.9"}, "203.0.113.5"),
    ({"X-Forwarded-For": "198.51.100.7", "X-Real-IP": "192.0.2.44"}, "198.51.100.7"),
    ({"X-Real-IP": "192.0.2.44"}, "192.0.2.44"),
    ({"X-Forwarded-For": "2001:db8::1"}, "2001:db8::1"),
    # empty list elements are ignored (RFC 9110 5.6.1), not the list
    ({"X-Forwarded-For": "203.0.113.5,,"}, "203.0.113.5"),
    ({"X-Forwarded-For": "198.51.100.1, , 203.0.113.5, 10.1.2.3"}, "203.0.113.5"),
])
def test_ip_from_trusted_peer(start_daemon, redis_server, headers, client):
    d = start_daemon(KEYS)
    r = check(d, "/check/ip/x", "GET", headers)
    assert r.status_code == 200 and remaining(r) == 1
    assert all_keys(redis_server.client()) == {rkey("ipk", client, "q", "fixed_window")}


def test_ip_headers_ignored_from_untrusted_peer(start_daemon, redis_server):
    d = start_daemon(KEYS.replace("[127.0.0.1/32, 10.0.0.0/8]", "[]"))
    for h in ({"X-Forwarded-For": "203.0.113.5"}, {"X-Real-IP": "192.0.2.44"},
              {"X-Forwarded-For": "1.2.3.4, 5.6.7.8", "X-Real-IP": "9.9.9.9"}):
        check(d, "/check/ip/x", "GET", h)
    assert all_keys(redis_server.client()) == {rkey("ipk", "127.0.0.1", "q", "fixed_window")}
    # all three counted against the peer: limit 2, so the last was denied
    r = check(d, "/check/ip/x", "GET", {"X-Forwarded-For": "203.0.113.77"})
    assert r.status_code == 429


@pytest.mark.parametrize("proxies", ["[\"::ffff:127.0.0.1/128\"]", "[\"::ffff:127.0.0.0/104\"]"])
def test_ipv4_mapped_trusted_range_is_the_ipv4_range(start_daemon, redis_server, proxies):
    """A trusted range written IPv4-mapped (as `ss` shows a dual-stack
    host's peers) trusts those IPv4 peers: it was kept as IPv6, never
    matched, and every client counted as the proxy."""
    d = start_daemon(KEYS.replace("[127.0.0.1/32, 10.0.0.0/8]", proxies))
    check(d, "/check/ip/x", "GET", {"X-Forwarded-For": "203.0.113.5"})
    assert all_keys(redis_server.client()) == {rkey("ipk", "203.0.113.5", "q", "fixed_window")}


def test_ips_counted_separately(start_daemon):
    d = start_daemon(KEYS)
    a = {"X-Forwarded-For": "203.0.113.1"}
    b = {"X-Forwarded-For": "203.0.113.2"}
    assert check(d, "/check/ip/x", "GET", a).status_code == 200
    assert check(d, "/check/ip/x", "GET", a).status_code == 200
    assert check(d, "/check/ip/x", "GET", a).status_code == 429
    r = check(d, "/check/ip/x", "GET", b)
    assert r.status_code == 200 and remaining(r) == 1


# ---------------------------------------------------------------- sources

def test_header_key(start_daemon, redis_server):
    d = start_daemon(KEYS)
    assert remaining(check(d, "/check/hdr/x", "GET", {"X-Api-Key": "k1"})) == 1
    assert remaining(check(d, "/check/hdr/x", "GET", {"x-api-key": "k1"})) == 0
    assert check(d, "/check/hdr/x", "GET", {"X-API-KEY": "k1"}).status_code == 429
    assert remaining(check(d, "/check/hdr/x", "GET", {"X-Api-Key": "k2"})) == 1
    # same key on another route: its own counter
    assert remaining(check(d, "/check/hdr2/x", "GET", {"X-Api-Key": "k1"})) == 1
    assert all_keys(redis_server.client()) == {
        rkey("hdr", "k1", "q", "fixed_window"), rkey("hdr", "k2", "q", "fixed_window"),
        rkey("hdr2", "k1", "q", "fixed_window")}


def test_query_key(start_daemon, redis_server):
    d = start_daemon(KEYS)
    r = check(d, "/check", "GET", {"X-Original-URI": "/qry/a?x=1&k=v1&y=2"})
    assert r.status_code == 200 and remaining(r) == 1
    r = check(d, "/check", "GET", {"X-Forwarded-Uri": "/qry/b?k=v1"})
    assert remaining(r) == 0
    r = check(d, "/check/qry/c?k=v2", "GET")
    assert remaining(r) == 1
    assert all_keys(redis_server.client()) == {
        rkey("qry", "v1", "q", "fixed_window"), rkey("qry", "v2", "q", "fixed_window")}


def test_cookie_key(start_daemon, redis_server):
    d = start_daemon(KEYS)
    r = check(d, "/check/ck/x", "GET", {"Cookie": "a=1; sid=s1; b=2"})
    assert r.status_code == 200 and remaining(r) == 1
    r = check(d, "/check/ck/x", "GET", {"Cookie": "sid=s1"})
    assert remaining(r) == 0
    r = check(d, "/check/ck/x", "GET", {"Cookie": "xsid=s1; sid=s2"})
    assert remaining(r) == 1
    assert all_keys(redis_server.client()) == {
        rkey("ck", "s1", "q", "fixed_window"), rkey("ck", "s2", "q", "fixed_window")}


def test_global_key(start_daemon, redis_server):
    d = start_daemon(KEYS)
    assert remaining(check(d, "/check/glob/x", "GET", {"X-Forwarded-For": "203.0.113.1"})) == 1
    assert remaining(check(d, "/check/glob/y", "GET", {"X-Forwarded-For": "203.0.113.2"})) == 0
    assert check(d, "/check/glob/z", "GET", {"X-Real-IP": "192.0.2.1"}).status_code == 429
    assert all_keys(redis_server.client()) == {rkey_global("glob", "q", "fixed_window")}


def test_named_check_on_a_global_route_uses_the_shared_bucket(start_daemon, redis_server):
    # A route keyed by `global` has one bucket (SPEC 4): naming a key in the
    # JSON form must not open a bucket of its own with a full quota.
    d = start_daemon(KEYS)
    assert [check(d, "/check/glob/x").status_code for _ in range(2)] == [200, 200]
    for body in ({"route": "glob", "key": "a"}, {"route": "glob"}):
        r = vcheck(d, body)
        assert r.status_code == 429, (body, r.status_code, r.text)
        assert r.json()["key"] == "*"
    assert all_keys(redis_server.client()) == {rkey_global("glob", "q", "fixed_window")}


def test_global_in_fallback_does_not_collide_with_literal_star(start_daemon, redis_server):
    d = start_daemon(policy(route("g", "/", "[header:K, global]", limit=1)))
    r = check(d, "/check/x", "GET", {"K": "*"})
    assert r.status_code == 200
    # no header: the global bucket, which must not be the client "*"
    r = check(d, "/check/x")
    assert r.status_code == 200, "a literal key '*' shares the global bucket"
    assert all_keys(redis_server.client()) == {"rl:{g:%2A}:q:fixed_window",
                                               rkey_global("g", "q", "fixed_window")}


def test_literal_star_key_is_not_global(start_daemon, redis_server):
    d = start_daemon(policy(route("g", "/g/", "global") + route("g2", "/h/", "header:K")))
    assert check(d, "/check/h/x", "GET", {"K": "*"}).status_code == 200
    assert rkey("g2", "*", "q", "fixed_window") == "rl:{g2:%2A}:q:fixed_window"
    assert all_keys(redis_server.client()) == {"rl:{g2:%2A}:q:fixed_window"}


@pytest.mark.parametrize("path,headers,key", [
    ("/fb/x?k=q1", {"X-Api-Key": "h1", "Cookie": "sid=c1"}, rkey("fb", "h1", "q", "fixed_window")),
    ("/fb/x?k=q1", {"Cookie": "sid=c1"}, rkey("fb", "q1", "q", "fixed_window")),
    ("/fb/x", {"Cookie": "sid=c1"}, rkey("fb", "c1", "q", "fixed_window")),
    ("/fb/x", {"X-Forwarded-For": "203.0.113.8"}, rkey_ip("fb", "203.0.113.8", "q", "fixed_window")),
    ("/fb/x", {}, rkey_ip("fb", "127.0.0.1", "q", "fixed_window")),
])
def test_fallback_first_present_wins(start_daemon, redis_server, path, headers, key):
    d = start_daemon(KEYS)
    r = check(d, "/check" + path, "GET", headers)
    assert r.status_code == 200 and remaining(r) == 1
    assert all_keys(redis_server.client()) == {key}


def test_a_value_spelling_an_address_is_not_that_address(start_daemon, redis_server):
    """key: [header:X-Api-Key, ip]: a client sending "X-Api-Key: 203.0.113.7"
    must not spend the quota of the client at 203.0.113.7, nor take an
    override written for address 10.9.9.9 (found by a security audit: both
    worked, the key being the bare value whatever its source)."""
    d = start_daemon(policy(
        route("mix", "/mix/", "[header:X-Api-Key, ip]", limit=3,
              extra='    overrides: [{keys: ["10.9.9.9", vip-key], unlimited: true}]\n'),
        top="trusted_proxies: [127.0.0.1/32]\n"))
    victim = {"X-Forwarded-For": "203.0.113.7"}
    attacker = {"X-Forwarded-For": "198.51.100.1", "X-Api-Key": "203.0.113.7"}
    assert remaining(check(d, "/check/mix/x", "GET", victim)) == 2
    assert [check(d, "/check/mix/x", "GET", attacker).status_code for _ in range(4)] == \
        [200, 200, 200, 429]
    assert remaining(check(d, "/check/mix/x", "GET", victim)) == 1
    # the address's exemption is the address's, the value's the value's
    forged = {"X-Forwarded-For": "198.51.100.1", "X-Api-Key": "10.9.9.9"}
    assert has_rl_headers(check(d, "/check/mix/x", "GET", forged))
    assert not has_rl_headers(check(d, "/check/mix/x", "GET", {"X-Forwarded-For": "10.9.9.9"}))
    assert not has_rl_headers(check(d, "/check/mix/x", "GET",
                                    {"X-Forwarded-For": "198.51.100.1", "X-Api-Key": "vip-key"}))
    assert all_keys(redis_server.client()) == {
        rkey_ip("mix", "203.0.113.7", "q", "fixed_window"),
        rkey("mix", "203.0.113.7", "q", "fixed_window"),
        rkey("mix", "10.9.9.9", "q", "fixed_window")}


def test_address_override_on_an_ip_route_is_canonical(start_daemon):
    """An override written "2001:DB8::1" or in full is the exemption of
    the client the daemon writes 2001:db8::1, on a route keyed by ip alone
    as on a mixed one (an audit found it ignored there)."""
    ovr = '    overrides: [{keys: ["2001:DB8::1", "2001:db8:0:0:0:0:0:2", "::FFFF:10.1.2.3"], ' \
          'unlimited: true}]\n'
    d = start_daemon(policy(route("o", "/o/", "ip", limit=1, extra=ovr),
                            top="trusted_proxies: [127.0.0.1/32]\n"))
    for ip in ("2001:db8::1", "2001:db8::2", "10.1.2.3", "2001:DB8:0::1"):
        codes = [check(d, "/check/o/x", "GET", {"X-Forwarded-For": ip}) for _ in range(3)]
        assert [r.status_code for r in codes] == [200] * 3, ip
        assert not any(has_rl_headers(r) for r in codes), ip
    codes = [check(d, "/check/o/x", "GET", {"X-Forwarded-For": "2001:db8::3"}).status_code
             for _ in range(2)]
    assert codes == [200, 429]


def test_a_named_key_that_is_no_address_finds_its_override_on_an_ip_route(start_daemon):
    """On a route keyed by ip alone, "unix" is the key of a client over a
    unix socket, and an override may name it: /v1/check naming that key
    gets the override, as the linear scan gave it (a review caught the
    sorted index missing it: 200 then 429)."""
    ovr = '    overrides: [{keys: [unix, "10.9.9.9"], unlimited: true}]\n'
    d = start_daemon(policy(route("o", "/o/", "ip", limit=1, extra=ovr)))
    for key in ("unix", "10.9.9.9", "10.009.9.9x"):
        got = [vcheck(d, {"route": "o", "key": key}) for _ in range(2)]
        if key == "10.009.9.9x":     # no override: the route's limit
            assert [r.status_code for r in got] == [200, 429], [r.text for r in got]
        else:
            assert all(r.status_code == 200 and r.json()["unlimited"] for r in got), \
                (key, [r.text for r in got])


def test_missing_key_deny_is_403(start_daemon, redis_server):
    d = start_daemon(KEYS)
    for path in ("/check/md/x", "/check/hdr/x", "/check/fbn/x"):   # explicit, default, list
        r = check(d, path)
        assert r.status_code == 403, path
        assert r.headers["Content-Type"].startswith("application/json")
        route = path.split("/")[2]
        assert r.json() == {"error": "missing_key", "route": route}
    assert all_keys(redis_server.client()) == set()


def test_missing_key_allow_is_200_without_headers(start_daemon, redis_server):
    d = start_daemon(KEYS)
    for _ in range(5):
        r = check(d, "/check/ma/x")
        assert r.status_code == 200 and not has_rl_headers(r) and r.content == b""
    assert all_keys(redis_server.client()) == set()
    # with the key present it is limited
    r = check(d, "/check/ma/x", "GET", {"X-Api-Key": "k"})
    assert r.status_code == 200 and remaining(r) == 1


# ---------------------------------------------------------------- odd and long keys

ODD = [":", "a:b", "{x}", "}", "{", "%3A", "%", "a b", "a  b", "é", "日本語",
       "x}:q:fixed_window", "k1:q", "*", "-._", "K1", "k1"]


def test_odd_keys_counted_separately(start_daemon, redis_server):
    d = start_daemon(KEYS)
    for k in ODD:
        for left in (1, 0):
            r = check(d, "/check/hdr/x", "GET", {"X-Api-Key": k.encode("utf-8")})
            assert r.status_code == 200, k
            assert remaining(r) == left, k
    for k in ODD:
        r = check(d, "/check/hdr/x", "GET", {"X-Api-Key": k.encode("utf-8")})
        assert r.status_code == 429, k
    assert all_keys(redis_server.client()) == {rkey("hdr", k, "q", "fixed_window") for k in ODD}


def test_odd_key_via_json_check(start_daemon, redis_server):
    d = start_daemon(KEYS)
    for k in ODD + ["a\nb", "\x7f\x01", "\t"]:
        v = vcheck(d, {"route": "hdr", "key": k})
        assert v.status_code == 200, (k, v.text)
        assert v.json()["remaining"] == 1
        assert v.json()["key"] == k
    keys = all_keys(redis_server.client())
    for k in ODD + ["a\nb", "\x7f\x01", "\t"]:
        assert rkey("hdr", k, "q", "fixed_window") in keys, k


def test_invalid_utf8_header_key(start_daemon, redis_server):
    d = start_daemon(KEYS)
    raw = b"\xff\xfe\x80"
    assert remaining(check(d, "/check/hdr/x", "GET", {"X-Api-Key": raw})) == 1
    assert remaining(check(d, "/check/hdr/x", "GET", {"X-Api-Key": raw})) == 0
    assert all_keys(redis_server.client()) == {"rl:{hdr:%FF%FE%80}:q:fixed_window"}


def test_long_keys_hashed_and_distinct(start_daemon, redis_server):
    d = start_daemon(KEYS)
    k256 = "a" * 256
    k257 = "a" * 257
    long1 = "x" * 1000 + "1"
    long2 = "x" * 1000 + "2"
    odd_long = ("é:{}% " * 60) + "z"   # 361 bytes with odd bytes
    for k in (k256, k257, long1, long2, odd_long):
        for left in (1, 0):
            r = check(d, "/check/hdr/x", "GET", {"X-Api-Key": k.encode()})
            assert r.status_code == 200 and remaining(r) == left, len(k)
    for k in (k256, k257, long1, long2, odd_long):
        assert check(d, "/check/hdr/x", "GET", {"X-Api-Key": k.encode()}).status_code == 429
    keys = all_keys(redis_server.client())
    expected = {rkey("hdr", k, "q", "fixed_window") for k in (k256, k257, long1, long2, odd_long)}
    assert keys == expected
    assert "rl:{hdr:" + "a" * 256 + "}:q:fixed_window" in keys
    assert sum(1 for k in keys if ":#" in k) == 4


def test_long_key_same_on_other_route_is_separate(start_daemon, redis_server):
    d = start_daemon(KEYS)
    k = "z" * 5000
    assert remaining(check(d, "/check/hdr/x", "GET", {"X-Api-Key": k})) == 1
    assert remaining(check(d, "/check/hdr/x", "GET", {"X-Api-Key": k})) == 0
    assert remaining(check(d, "/check/hdr2/x", "GET", {"X-Api-Key": k})) == 1
    assert all_keys(redis_server.client()) == {
        rkey("hdr", k, "q", "fixed_window"), rkey("hdr2", k, "q", "fixed_window")}


def test_key_prefix(start_daemon, redis_server):
    d = start_daemon(policy(route("p", "/", "header:K"), redis='  key_prefix: "app1:"\n'))
    assert check(d, "/check/x", "GET", {"K": "v"}).status_code == 200
    assert all_keys(redis_server.client()) == {"app1:{p:v}:q:fixed_window"}


def test_default_limit_names(start_daemon, redis_server):
    d = start_daemon(policy(
        "  - name: n\n    match: {prefix: /}\n    key: header:K\n    limits:\n"
        "      - {algorithm: fixed_window, limit: 5, window: 1h}\n"
        "      - {algorithm: fixed_window, limit: 6, window: 1h}\n"
        '      - {algorithm: token_bucket, rate: "1/s", burst: 7}\n'))
    v = vcheck(d, {"route": "n", "key": "v"}).json()
    assert [l["name"] for l in v["limits"]] == ["fixed_window", "fixed_window-2", "token_bucket"]
    assert all_keys(redis_server.client()) == {
        "rl:{n:v}:fixed_window:fixed_window", "rl:{n:v}:fixed_window-2:fixed_window",
        "rl:{n:v}:token_bucket:token_bucket"}


def test_ip_spellings_share_one_counter(start_daemon, redis_server):
    d = start_daemon(KEYS)
    for spelling in ("2001:db8::1", "2001:DB8:0:0::1", "2001:0db8:0000::0001"):
        check(d, "/check/ip/x", "GET", {"X-Forwarded-For": spelling})
    assert all_keys(redis_server.client()) == {rkey("ipk", "2001:db8::1", "q", "fixed_window")}
    v = vcheck(d, {"method": "GET", "path": "/ip/x", "ip": "2001:0DB8::0:1"})
    assert v.status_code == 429   # the same client, already at its limit of 2


def test_every_key_expires(start_daemon, redis_server):
    d = start_daemon(policy(
        "  - name: e\n    match: {prefix: /}\n    key: header:K\n    limits:\n"
        "      - {name: w, algorithm: fixed_window, limit: 3, window: 1h}\n"
        '      - {name: b, algorithm: token_bucket, rate: "1/m", burst: 3}\n'))
    for k in ("a", "b", "b", "b", "b", "x" * 400):
        check(d, "/check/x", "GET", {"K": k})
    rc = redis_server.client()
    keys = list(rc.scan_iter())
    assert len(keys) == 6
    for k in keys:
        ttl = rc.pttl(k)
        assert ttl > 0, (k, ttl)
        # a window's counter lives to the window's end; a bucket until full
        assert ttl <= 3600 * 1000 + 1000, (k, ttl)


@pytest.mark.parametrize("n", [4095, 4096, 4097, 6000])
def test_long_query_keys_do_not_collide(start_daemon, redis_server, n):
    d = start_daemon(KEYS)
    k1 = "q" * (n - 1) + "1"
    k2 = "q" * (n - 1) + "2"
    for k in (k1, k1):
        check(d, "/check", "GET", {"X-Original-URI": "/qry/a?k=" + k})
    r = check(d, "/check", "GET", {"X-Original-URI": "/qry/a?k=" + k2})
    assert r.status_code == 200 and remaining(r) == 1, "two long query keys share a counter"
    assert all_keys(redis_server.client()) == {rkey("qry", k1, "q", "fixed_window"),
                                               rkey("qry", k2, "q", "fixed_window")}


def test_long_cookie_and_json_keys_do_not_collide(start_daemon, redis_server):
    d = start_daemon(KEYS)
    c1, c2 = "c" * 9000 + "1", "c" * 9000 + "2"
    assert remaining(check(d, "/check/ck/x", "GET", {"Cookie": "sid=" + c1})) == 1
    assert remaining(check(d, "/check/ck/x", "GET", {"Cookie": "sid=" + c2})) == 1
    j1, j2 = "j" * 50000 + "1", "j" * 50000 + "2"
    assert vcheck(d, {"route": "hdr", "key": j1}).json()["remaining"] == 1
    assert vcheck(d, {"route": "hdr", "key": j2}).json()["remaining"] == 1
    assert all_keys(redis_server.client()) == {
        rkey("ck", c1, "q", "fixed_window"), rkey("ck", c2, "q", "fixed_window"),
        rkey("hdr", j1, "q", "fixed_window"), rkey("hdr", j2, "q", "fixed_window")}


def test_query_key_on_bare_check_path(start_daemon, redis_server):
    d = start_daemon(policy(route("root", "/", "query:k")))
    r = check(d, "/check?k=v1&z=2", "GET")
    assert r.status_code == 200 and remaining(r) == 1
    r = check(d, "/check/?k=v1", "GET")
    assert remaining(r) == 0
    assert all_keys(redis_server.client()) == {rkey("root", "v1", "q", "fixed_window")}


def test_query_names_decoded_and_empty_values_skipped(start_daemon, redis_server):
    """The application reads `us%65r=` as `user=`, and an empty value is
    absent for a query key as for every key source: a later one counts."""
    d = start_daemon(KEYS)
    for uri, key in (("/qry/a?%6B=v1", "v1"), ("/qry/a?k=&k=v2", "v2"),
                     ("/qry/a?k+=no&k=v3", "v3")):
        r = check(d, "/check", "GET", {"X-Original-URI": uri})
        assert r.status_code == 200 and remaining(r) == 1, (uri, r.text)
        assert rkey("qry", key, "q", "fixed_window") in all_keys(redis_server.client())


@pytest.mark.parametrize("path,lines,key", [
    # RFC 9110 5.3: repeated field lines are one comma-separated list, so
    # the right-most untrusted hop is in the last line (the one our proxy
    # added), not in the first line (which the client wrote)
    ("/check/ip/x", b"X-Forwarded-For: 6.6.6.6\r\nX-Forwarded-For: 203.0.113.5\r\n",
     rkey("ipk", "203.0.113.5", "q", "fixed_window")),
    # an HTTP/2 client's cookies can reach us as several Cookie lines (a
    # gateway passing its cookie fields on as they came)
    ("/check/ck/x", b"Cookie: a=1\r\nCookie: sid=\r\nCookie: sid=s7\r\n",
     rkey("ck", "s7", "q", "fixed_window")),
    # a header key: the first line with a value
    ("/check/hdr/x", b"X-Api-Key:\r\nX-Api-Key: k2\r\n", rkey("hdr", "k2", "q", "fixed_window")),
])
def test_header_sent_on_several_lines(start_daemon, redis_server, path, lines, key):
    from helpers import raw_http, status_of
    d = start_daemon(KEYS)
    out = raw_http(d.port, b"GET " + path.encode() + b" HTTP/1.1\r\nHost: x\r\n" + lines
                   + b"Connection: close\r\n\r\n")
    assert status_of(out) == 200
    assert all_keys(redis_server.client()) == {key}


# ---------------------------------------------------------------- client_ipv6_prefix

def test_ipv6_prefix_counts_a_network_as_one_client(start_daemon, redis_server):
    """client_ipv6_prefix: 64: the addresses of one /64 share one bucket
    (a host holds a whole /64, and with each address its own client it
    took a fresh quota from each); another /64 is another client, and
    IPv4, v4-mapped or not, is the whole address."""
    d = start_daemon(policy(route("ipk", "/ip/", "ip", limit=2),
                            top="trusted_proxies: [127.0.0.1/32]\nclient_ipv6_prefix: 64\n"))
    one = ["2001:db8:1:2::1", "2001:DB8:1:2:ffff:ffff:ffff:ffff", "2001:db8:1:2:0:0:0:9"]
    codes = [check(d, "/check/ip/x", "GET", {"X-Forwarded-For": ip}).status_code for ip in one]
    assert codes == [200, 200, 429]
    r = check(d, "/check/ip/x", "GET", {"X-Forwarded-For": "2001:db8:1:3::1"})
    assert r.status_code == 200 and remaining(r) == 1
    # /v1/check's "ip" is the same client, and its reply names the network
    r = vcheck(d, {"path": "/ip/x", "ip": "2001:db8:1:2::abcd"})
    assert r.status_code == 429 and r.json()["allowed"] is False
    assert r.json()["key"] == "2001:db8:1:2::/64"
    for ip in ("198.51.100.1", "::ffff:198.51.100.2"):
        r = check(d, "/check/ip/x", "GET", {"X-Forwarded-For": ip})
        assert r.status_code == 200 and remaining(r) == 1, ip
    assert all_keys(redis_server.client()) == {
        rkey("ipk", c, "q", "fixed_window") for c in
        ("2001:db8:1:2::/64", "2001:db8:1:3::/64", "198.51.100.1", "198.51.100.2")}


def test_ipv6_prefix_default_keeps_each_address(start_daemon, redis_server):
    d = start_daemon(policy(route("ipk", "/ip/", "ip", limit=1),
                            top="trusted_proxies: [127.0.0.1/32]\n"))
    for ip in ("2001:db8:1:2::1", "2001:db8:1:2::2"):
        assert check(d, "/check/ip/x", "GET", {"X-Forwarded-For": ip}).status_code == 200
    assert all_keys(redis_server.client()) == {
        rkey("ipk", c, "q", "fixed_window") for c in ("2001:db8:1:2::1", "2001:db8:1:2::2")}


@pytest.mark.parametrize("key", ["2001:db8:1:2::99", "2001:db8:1:2::/64", "[2001:db8:1:2::1]:443"])
def test_ipv6_prefix_named_key_is_its_network(start_daemon, redis_server, key):
    """/v1/check naming an address (or the network as the daemon writes it)
    on a route keyed by ip charges the network's bucket, as /check would."""
    d = start_daemon(policy(route("ipk", "/ip/", "ip", limit=2),
                            top="trusted_proxies: [127.0.0.1/32]\nclient_ipv6_prefix: 64\n"))
    r = vcheck(d, {"route": "ipk", "key": key})
    assert r.status_code == 200 and r.json()["key"] == "2001:db8:1:2::/64", r.text
    r = check(d, "/check/ip/x", "GET", {"X-Forwarded-For": "2001:db8:1:2::5"})
    assert r.status_code == 200 and remaining(r) == 0


def test_ipv6_prefix_overrides_name_networks(start_daemon, tmp_path):
    """An override's address applies to its whole network, with a warning
    when it has bits past the prefix; the network as written ("/64") is a
    key too. A prefix given after the routes still applies to them."""
    ovr = ('    overrides: [{keys: ["2001:db8:9::5", "2001:db8:8::/64", "10.1.2.3"], '
           'unlimited: true}]\n')
    d = start_daemon(policy(route("o", "/o/", "ip", limit=1, extra=ovr),
                            top="trusted_proxies: [127.0.0.1/32]\n") + "client_ipv6_prefix: 64\n")
    for ip in ("2001:db8:9::5", "2001:db8:9::77", "2001:db8:8::1", "10.1.2.3"):
        got = [check(d, "/check/o/x", "GET", {"X-Forwarded-For": ip}) for _ in range(2)]
        assert [r.status_code for r in got] == [200, 200], ip
        assert not any(has_rl_headers(r) for r in got), ip
    got = [check(d, "/check/o/x", "GET", {"X-Forwarded-For": "2001:db8:9:1::5"}).status_code
           for _ in range(2)]
    assert got == [200, 429]
    log = d.log()
    assert ('warning: overrides: "2001:db8:9::5" applies to every address of '
            "2001:db8:9::/64 (client_ipv6_prefix: 64 counts them as one client)") in log
    assert "2001:db8:8::/64" not in log     # as the daemon writes it: no warning


def test_ipv6_prefix_keeps_ipv4_written_in_ipv6_whole(start_daemon, redis_server):
    """Behind a NAT64/SIIT translator every IPv4 client arrives as
    64:ff9b::a.b.c.d: cut to a /64, the whole IPv4 internet was one client
    (a review). Those, ::1 and link-local addresses stay whole."""
    d = start_daemon(policy(route("ipk", "/ip/", "ip", limit=1),
                            top="trusted_proxies: [127.0.0.1/32]\nclient_ipv6_prefix: 64\n"))
    for ip in ("64:ff9b::198.51.100.1", "64:ff9b::203.0.113.9", "64:ff9b:1::a00:1",
               "fe80::1", "fe80::2", "::1"):
        r = check(d, "/check/ip/x", "GET", {"X-Forwarded-For": ip})
        assert r.status_code == 200 and remaining(r) == 0, ip
    r = vcheck(d, {"route": "ipk", "key": "64:ff9b::198.51.100.1"})
    assert r.status_code == 429 and r.json()["key"] == "64:ff9b::c633:6401", r.text
