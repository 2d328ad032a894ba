"""`ratelimitd -t -c FILE`: good files pass, bad files give one
`FILE:LINE:COL: message` line per error, all at once, exit 1, never a crash
(SPEC §2, §4)."""
import os
import re

import pytest

from helpers import validate

BASE = [
    "server:",                                                                   # 1
    "  listen: 127.0.0.1:8080",                                                  # 2
    "  deny_status: 429",                                                        # 3
    "redis:",                                                                    # 4
    "  address: 127.0.0.1:6379",                                                 # 5
    "  timeout: 50ms",                                                           # 6
    "failure_mode: open",                                                        # 7
    "trusted_proxies: [127.0.0.1/32, '::1/128']",                                # 8
    "routes:",                                                                   # 9
    "  - name: api",                                                             # 10
    "    match: { prefix: /api/, methods: [GET, POST] }",                        # 11
    "    key: [header:X-Api-Key, ip]",                                           # 12
    "    limits:",                                                               # 13
    '      - { name: burst, algorithm: token_bucket, rate: "10/s", burst: 20 }', # 14
    "      - { name: hourly, algorithm: fixed_window, limit: 1000, window: 1h }",# 15
    "  - name: web",                                                             # 16
    "    match: { regex: '^/v[0-9]+/' }",                                        # 17
    "    key: ip",                                                               # 18
    "    limits:",                                                               # 19
    "      - name: w",                                                           # 20
    "        algorithm: fixed_window",                                           # 21
    "        limit: 10",                                                         # 22
    "        window: 10s",                                                       # 23
]

LINE_RE = re.compile(r"^(.*):(\d+):(\d+): (.+)$")


def write(tmp_path, lines, name="policy.yaml"):
    p = os.path.join(str(tmp_path), name)
    with open(p, "w") as f:
        f.write("\n".join(lines) + "\n")
    return p


def variant(changes=None, insert=None, delete=()):
    """BASE with {lineno: new text} replaced, lines inserted before a
    lineno ({lineno: [lines]}), and linenos deleted (all 1-based, BASE numbers)."""
    out = []
    for i, line in enumerate(BASE, 1):
        for extra in (insert or {}).get(i, []):
            out.append(extra)
        if i in delete:
            continue
        out.append((changes or {}).get(i, line))
    return out


def run_bad(path):
    p = validate(path)
    assert p.returncode == 1, "exit %r (negative = signal)\nstderr: %s" % (
        p.returncode, p.stderr.decode("utf-8", "replace"))
    err = p.stderr.decode("utf-8", "replace")
    lines = [l for l in err.splitlines() if l.strip()]
    assert lines, "no error printed"
    parsed = []
    for l in lines:
        m = LINE_RE.match(l)
        assert m, "not FILE:LINE:COL: message: %r" % l
        assert m.group(1) == path, l
        assert int(m.group(2)) >= 1 and int(m.group(3)) >= 1, l
        parsed.append((int(m.group(2)), int(m.group(3)), m.group(4)))
    return parsed


def run_good(path):
    """The policy loads (warnings allowed): what -t printed on stderr."""
    p = validate(path)
    assert p.returncode == 0, p.stderr.decode()
    return p.stderr.decode()


def with_overrides(*items):
    """BASE with these override entries on its route (YAML flow mappings)."""
    return variant(insert={16: ['    overrides:'] + ['      - ' + i for i in items]})


def col_of(text, token):
    i = text.index(token)
    return i + 1


def test_good_base_file(tmp_path):
    path = write(tmp_path, BASE)
    p = validate(path)
    assert p.returncode == 0, p.stderr.decode()
    assert p.stdout.decode().strip() == "%s: ok" % path
    assert p.stderr.decode().strip() == ""


SPEC_EXAMPLE = """\
server:
  listen: 127.0.0.1:8080        # host:port, [v6]:port or unix:/path
  workers: 1                    # event-loop threads (or "auto" = cores)
  deny_status: 429
  ietf_headers: false
  idle_timeout: 60s
  drain_timeout: 5s
redis:
  address: 127.0.0.1:6379       # host:port or unix:/path
  database: 0
  username: ~                   # optional ACL user
  password_env: REDIS_PASSWORD  # the password is read from this env var, never the file
  timeout: 50ms                 # per check deadline
  connect_timeout: 500ms
  key_prefix: "rl:"
failure_mode: open              # open | closed; a route's own failure_mode overrides it
trusted_proxies: [127.0.0.1/32, "::1/128"]   # SPEC writes ::1/128 bare: invalid YAML in a flow list
log: { level: info, format: text, access: false }
routes:                         # evaluated in order; the first match wins
  - name: login
    match: { path: /auth/login, methods: [POST] }     # exact path
    key: ip
    limits:
      - { name: per-minute, algorithm: sliding_window_log, limit: 5, window: 1m }
  - name: api
    match: { prefix: /api/, host: api.example.com }   # or regex: '^/v[0-9]+/'
    key: [header:X-Api-Key, ip]                       # first present wins
    missing_key: deny         # default; deny = 403, allow = pass unlimited, no headers
    deny_status: 429          # optional per-route override of server.deny_status
    failure_mode: open        # optional per-route override
    limits:
      - { name: burst, algorithm: token_bucket, rate: "10/s", burst: 20 }
      - { name: hourly, algorithm: fixed_window, limit: 1000, window: 1h }
    overrides:                # per client key; an override's limits replace the route's
      - { keys: [partner-1], limits: [ { algorithm: gcra, rate: "100/s", burst: 50 } ] }
      - { keys: [internal-monitor], unlimited: true }
  - name: default
    match: { prefix: / }
    key: ip
    shadow: true   # evaluate, charge and report as if enforced (headers and
                   # limits[].allowed tell the truth), but always reply 200
    limits:
      - { algorithm: sliding_window_counter, limit: 100, window: 1m, precision: 5s }
"""


def test_good_spec_example(tmp_path):
    path = os.path.join(str(tmp_path), "spec.yaml")
    with open(path, "w") as f:
        f.write(SPEC_EXAMPLE)
    p = validate(path)
    assert p.returncode == 0, p.stderr.decode()
    assert p.stdout.decode().strip() == "%s: ok" % path


def test_good_forms(tmp_path):
    lines = [
        "server:",
        "  listen: '[::1]:8080'",
        "  workers: auto",
        "redis:",
        "  address: unix:/tmp/redis.sock",
        "  timeout: 250ms",
        "trusted_proxies: []",
        "routes:",
        "  - name: a",
        "    match: { prefix: / }",
        "    key: global",
        "    limits:",
        '      - { algorithm: token_bucket, rate: "600/m", burst: 5 }',
        '      - { algorithm: token_bucket, rate: "5/10s", burst: 5 }',
        '      - { algorithm: token_bucket, rate: "100/h", burst: 5 }',
        '      - { algorithm: token_bucket, rate: "1000/d", burst: 5 }',
        '      - { algorithm: token_bucket, rate: "1/250ms", burst: 5 }',
        "      - { algorithm: fixed_window, limit: 1, window: 250ms }",
        "      - { algorithm: fixed_window, limit: 1, window: 1d }",
        "      - { algorithm: fixed_window, limit: 1, window: 10m }",
        "  - name: b",
        "    match: { path: /b, host: b.example.com, methods: [GET, HEAD] }",
        "    key: [query:k, cookie:sid, header:X-K]",
        "    missing_key: allow",
        "    limits: [ { algorithm: fixed_window, limit: 3, window: 1s } ]",
    ]
    path = write(tmp_path, lines)
    p = validate(path)
    assert p.returncode == 0, p.stderr.decode()
    assert p.stdout.decode().strip() == "%s: ok" % path


def test_good_regexes(tmp_path):
    """GNU escapes, escaped punctuation and classes stay accepted."""
    for rx in ("'^/v[0-9]+/'", "'^/\\w+\\.json$'", "'^/a\\b'", "'^/[[:digit:]\\]+$'",
               "'^/[]a]\\/x'", "'^/[^]/]+$'", "'\\s\\S\\W\\B'",
               # at most 1000 copies beyond what the pattern writes
               "'(a{1,100}){1,10}b'", "'[0-9]{1,1000}x'", "'^/%s$'" % ("a" * 1500),
               "'^/[(]{1,500}\\){1,500}'", "'a|b{0}|c{3,}|d{,3}'"):
        path = write(tmp_path, variant({17: "    match: { regex: %s }" % rx}))
        p = validate(path)
        assert p.returncode == 0, (rx, p.stderr.decode())


def _regex_routes(n, regex):
    return ("routes:\n" + "".join(
        "  - name: r%d\n    match: { regex: '%s' }\n    key: ip\n"
        "    limits: [ { algorithm: gcra, rate: 1/s, burst: 1 } ]\n" % (i, regex % i)
        for i in range(n)))


def test_regexes_are_bounded_by_what_they_take_to_compile_together(tmp_path):
    """Each "[a-z]{1,1000}" alone is allowed, but glibc compiles it in 8 MB
    (its optional copies cost their square): a thousand routes of them took
    8 GB and 40 s to load (an audit). The file's regexes share a budget,
    and the first over it is named where it is written."""
    path = tmp_path / "many.yaml"
    path.write_text(_regex_routes(12, "^/[a-z]{1,1000}x%d"))
    p = validate(str(path))
    err = p.stderr.decode()
    assert p.returncode == 1, err
    lines = [l for l in err.splitlines() if "MB to compile" in l]
    # eight fit in 64 MB; the ninth (line 35, column 21) and later do not
    assert len(lines) == 4 and lines[0].startswith("%s:35:21: regex: " % path), err
    assert "at most 64 MB" in lines[0] and "use + or *" in lines[0], lines[0]
    # a group repeated is written out whole, its own intervals' cost too
    # (a review: 1000 of these passed, at 909 MB and 5.5 s)
    path.write_text(_regex_routes(200, "^/%d/([a-z]{1,90}){11}"))
    p = validate(str(path))
    assert p.returncode == 1 and "MB to compile" in p.stderr.decode(), p.stderr.decode()[-2000:]
    # a thousand routes of a plausible bounded pattern stay within it
    path.write_text(_regex_routes(1000, "^/[a-z0-9-]{1,64}/item%d$"))
    p = validate(str(path), timeout=60)
    assert p.returncode == 0, p.stderr.decode()[-2000:]


def test_good_listen_unix(tmp_path):
    path = write(tmp_path, variant({2: "  listen: unix:/tmp/ratelimitd-test.sock"}))
    p = validate(path)
    assert p.returncode == 0, p.stderr.decode()


# (name, variant kwargs, expected line, acceptable columns, word in message or None)
def _cases():
    cases = []

    def add(name, changes=None, line=None, token=None, word=None, insert=None,
            cols=None, delete=()):
        lines = variant(changes, insert, delete)
        text = lines[line - 1]
        c = set(cols or [])
        if token is not None:
            c.add(col_of(text, token))
        cases.append(pytest.param(lines, line, c, word, id=name))

    add("unknown_top_key", insert={9: ["colour: red"]}, line=9, token="colour", word="colour")
    add("unknown_server_key", {2: "  listn: 127.0.0.1:8080"}, 2, "listn", "listn")
    add("unknown_redis_key", {6: "  timeuot: 50ms"}, 6, "timeuot", "timeuot")
    add("unknown_route_key", insert={18: ["    colour: red"]}, line=18, token="colour",
        word="colour")
    add("unknown_limit_key_flow",
        {14: '      - { name: burst, algorithm: token_bucket, rate: "10/s", burst: 20, colour: 1 }'},
        14, "colour", "colour")
    add("unknown_limit_key_block", insert={23: ["        colour: 1"]}, line=23, token="colour",
        word="colour")
    add("unknown_match_key", {11: "    match: { prefix: /api/, methds: [GET] }"}, 11, "methds", "methds")
    add("wrong_type_limit_word", {22: "        limit: many"}, 22, "many")
    add("wrong_type_limit_list", {22: "        limit: [10]"}, 22, "[10]")
    add("wrong_type_deny_status", {3: "  deny_status: abc"}, 3, "abc")
    add("wrong_type_routes_scalar", {9: "routes: 5"}, 9, "5",
        delete=range(10, 24))
    add("wrong_type_match_scalar", {11: "    match: /api/"}, 11, "/api/")
    add("wrong_type_server_list", {1: "server: [1, 2]"}, 1, "[1", delete=(2, 3))
    add("wrong_type_ietf", {3: "  ietf_headers: maybe"}, 3, "maybe")
    add("bad_duration_10x", {23: "        window: 10x"}, 23, "10x")
    add("bad_duration_unit_only", {23: "        window: ms"}, 23, "ms")
    add("bad_duration_negative", {23: "        window: -1s"}, 23, "-1s")
    add("bad_duration_timeout", {6: "  timeout: 10x"}, 6, "10x")
    add("bad_duration_number", {6: "  timeout: 50"}, 6, "50")
    add("bad_rate_unit", {14: '      - { name: burst, algorithm: token_bucket, rate: "10/x", burst: 20 }'},
        14, '"10/x"')
    add("bad_rate_word", {14: '      - { name: burst, algorithm: token_bucket, rate: "ten/s", burst: 20 }'},
        14, '"ten/s"')
    add("bad_rate_no_slash", {14: '      - { name: burst, algorithm: token_bucket, rate: "10", burst: 20 }'},
        14, '"10"')
    add("bad_rate_zero", {14: '      - { name: burst, algorithm: token_bucket, rate: "0/s", burst: 20 }'},
        14, '"0/s"')
    add("bad_limit_negative", {22: "        limit: -5"}, 22, "-5")
    add("bad_limit_zero", {22: "        limit: 0"}, 22, "0")
    add("bad_algorithm", {21: "        algorithm: bogus"}, 21, "bogus")
    add("bad_key_source", {18: "    key: bogus"}, 18, "bogus")
    add("bad_key_source_empty_header", {18: "    key: 'header:'"}, 18, "'header:'")
    add("bad_key_source_in_list", {12: "    key: [header:X-Api-Key, bogus, ip]"}, 12, "bogus")
    add("bad_duration_in_flow_map",
        {15: "      - { name: hourly, algorithm: fixed_window, limit: 1000, window: 1x }"},
        15, "1x }")
    add("bad_failure_mode", {7: "failure_mode: maybe"}, 7, "maybe")
    add("bad_trusted_proxy", {8: "trusted_proxies: [127.0.0.1/32, not-a-cidr]"}, 8, "not-a-cidr")
    add("bad_trusted_proxy_prefix", {8: "trusted_proxies: [10.0.0.0/33]"}, 8, "10.0.0.0/33")
    add("bad_regex", {17: "    match: { regex: '^/v[0-9+/' }"}, 17, "'^/v[0-9+/'")
    # a host is compared whole: these could never match a request
    for i, host in enumerate(("'*.example.com'", "https://api.example.com", "'a b'",
                              "'api.example.com:0'", "'api:'", "'[::1]x'", "'[::1'",
                              "'api.example.com/v1'", "'a.example.com, b.example.com'")):
        add("bad_host_%d" % i, {11: "    match: { prefix: /api/, host: %s }" % host},
            11, host, "host")
    # a back-reference takes time exponential in a client's path (an
    # audit held a worker 10 s with a 400-byte path); \\d is the letter d
    for i, (rx, says) in enumerate((("'^/(.*)(.*)\\2\\1x$'", "back-reference"),
                                    ("'^/v\\d+/'", "[0-9]"), ("'^/\\D'", "[^0-9]"),
                                    ("'^/a\\p'", "letter p"),
                                    ("'^/v[\\d]+/'", "inside [...]"),
                                    # repeat counts are written out, nested
                                    # ones multiplied: 12 s for one 2 KB path
                                    ("'^/((a{1,30}){1,30}){1,30}b$'", "1000 extra copies"),
                                    ("'^/[a-z]{1,12000}$'", "nested counts multiply"),
                                    ("'(x{1,600})(y{1,600})'", "use + or *"),
                                    ("'^/(ab{2,}){1,600}'", "1000 extra copies"),
                                    ("'a)|b'", "closes no '('"))):
        add("bad_regex_%d" % i, {17: "    match: { regex: %s }" % rx}, 17, rx, says)
    add("bad_listen_word", {2: "  listen: nowhere"}, 2, "nowhere")
    add("bad_listen_port", {2: "  listen: 127.0.0.1:99999"}, 2, "127.0.0.1:99999")
    add("bad_listen_no_port", {2: "  listen: '127.0.0.1:'"}, 2, "'127.0.0.1:'")
    add("bad_redis_address", {5: "  address: 127.0.0.1:notaport"}, 5, "127.0.0.1:notaport")
    add("bad_max_batch_zero", {6: "  max_batch: 0"}, 6, "0", "max_batch")
    add("bad_max_batch_big", {6: "  max_batch: 1001"}, 6, "1001", "max_batch")
    add("bad_max_batch_word", {6: "  max_batch: many"}, 6, "many", "max_batch")
    add("duplicate_route_name", {16: "  - name: api"}, 16, "api", "api", cols=[5])
    add("empty_limits_flow", {19: "    limits: []"}, 19, "[]", "limits", cols=[5],
        delete=(20, 21, 22, 23))
    add("empty_limits_null", {19: "    limits:"}, 19, None, "limits",
        delete=(20, 21, 22, 23))
    add("yaml_syntax_colon", {18: "    key: ip: x"}, 18, None, None, cols=[12])
    add("yaml_syntax_tab", {18: "\tkey: ip"}, 18, None, None, cols=[1])
    add("anchor", {14: '      - &b { name: burst, algorithm: token_bucket, rate: "10/s", burst: 20 }'},
        14, "&b")
    add("alias", {18: "    key: *k"}, 18, "*k")
    return cases


@pytest.mark.parametrize("lines,line,cols,word", _cases())
def test_bad_file_reports_line_and_column(tmp_path, lines, line, cols, word):
    path = write(tmp_path, lines)
    errs = run_bad(path)
    hits = [e for e in errs if e[0] == line and (not cols or e[1] in cols)]
    assert hits, "want %d:%s, got %s" % (line, sorted(cols), errs)
    if word:
        assert any(word in e[2] for e in hits), errs


def _exact_cases():
    """Mistakes with the whole message they must give (each found untested
    by a coverage run of the suite): (id, lines, [(line, col, message)])."""
    long_path = "unix:/" + "a" * 120
    big_burst = '      - { name: burst, algorithm: token_bucket, rate: "7/365d", burst: 1000 }'
    cases = [
        ("unix_relative", variant({5: "  address: unix:relative.sock"}),
         [(5, 12, 'address: "unix:relative.sock": unix socket path must be absolute '
                  '(unix:/path)')]),
        ("unix_too_long", variant({5: "  address: " + long_path}),
         [(5, 12, 'address: "%s": unix socket path is too long' % long_path)]),
        ("ipv6_without_brackets", variant({5: "  address: '::1:6379'"}),
         [(5, 12, 'address: "::1:6379": IPv6 addresses need brackets: [addr]:port')]),
        ("ipv6_unclosed", variant({5: "  address: '[::1'"}),
         [(5, 12, 'address: "[::1": expected [ipv6]:port')]),
        ("ipv6_no_port", variant({5: "  address: '[::1]x'"}),
         [(5, 12, 'address: "[::1]x": expected [ipv6]:port')]),
        ("ipv6_bad", variant({5: "  address: '[zz]:6379'"}),
         [(5, 12, 'address: "[zz]:6379": bad IPv6 address')]),
        ("key_prefix_brace", variant(insert={6: ["  key_prefix: 'a{b}'"]}),
         [(6, 15, "key_prefix: must not contain { or } (the hash tag is ours)")]),
        ("duplicate_key", variant(insert={6: ["  address: 127.0.0.1:6380"]}),
         [(6, 3, 'redis: duplicate key "address"')]),
        ("complex_key", variant(insert={9: ["? [a]", ": 1"]}),
         [(9, 3, "policy: keys must be plain names")]),
        ("route_without_name", variant({16: "  - key: ip"}, delete=(18,)),
         [(16, 5, 'route: "name" is required')]),
        ("two_path_forms", variant({11: "    match: { prefix: /api/, path: /api/x }"}),
         [(11, 35, "match: use only one of path, prefix and regex")]),
        ("methods_mapping", variant({11: "    match: { prefix: /api/, methods: {GET: 1} }"}),
         [(11, 38, "methods: expected a list of methods")]),
        ("key_empty_list", variant({18: "    key: []"}),
         [(18, 10, "key: expected a key source or a non-empty list of them")]),
        ("limit_without_algorithm", variant(delete=(21,)),
         [(20, 9, 'limits[0]: "algorithm" is required')]),
        ("limit_name_chars", variant({20: "      - name: 'bad name!'"}),
         [(20, 15, 'name: "bad name!" must be 1-64 characters of A-Z a-z 0-9 _ - .')]),
        ("burst_past_exact_counting", variant({14: big_burst}),
         [(14, col_of(big_burst, "1000"), 'burst: 1000 with rate "7/365d" is too large to '
           "count exactly; use a smaller burst or a rate over a shorter period")]),
        ("overrides_mapping", variant(insert={16: ["    overrides: {a: 1}"]}),
         [(16, 16, "overrides: expected a list")]),
        ("override_without_keys", with_overrides("{ unlimited: true }"),
         [(17, 9, 'override: "keys" is required')]),
        ("override_keys_empty", with_overrides("{ keys: [], unlimited: true }"),
         [(17, 17, "keys: expected a non-empty list of client keys")]),
        ("override_limited_and_unlimited", with_overrides(
            "{ keys: [a], unlimited: true, limits: [{ algorithm: fixed_window, limit: 1, "
            "window: 1s }] }"),
         [(17, 9, 'override: use either "limits" or "unlimited: true", not both')]),
        ("override_neither", with_overrides("{ keys: [a] }"),
         [(17, 9, 'override: needs "limits" or "unlimited: true"')]),
    ]
    return [pytest.param(lines, want, id=name) for name, lines, want in cases]


@pytest.mark.parametrize("lines,want", _exact_cases())
def test_each_mistake_gets_its_message(tmp_path, lines, want):
    assert run_bad(write(tmp_path, lines)) == want


def test_an_unbalanced_regex_names_the_pattern(tmp_path):
    """regcomp's own words follow (glibc's), after the pattern as written."""
    errs = run_bad(write(tmp_path, variant({17: "    match: { regex: '^/v((' }"})))
    assert len(errs) == 1 and errs[0][:2] == (17, 21), errs
    head = 'regex: "^/v((": '
    assert errs[0][2].startswith(head) and errs[0][2][len(head):].strip(), errs


def test_anchor_and_alias_together(tmp_path):
    lines = variant({10: "  - name: &n api", 16: "  - name: *n"})
    path = write(tmp_path, lines)
    errs = run_bad(path)
    assert any((l, c) in ((10, 11), (16, 11)) for l, c, _ in errs), errs


def test_an_alias_or_a_nul_leaves_the_rest_of_the_file_checked(tmp_path):
    """An alias or a NUL stopped the reading: the file's other errors went
    unsaid until it was mended (an audit). They are said with it, and
    nothing is said about the refused value itself beyond its refusal."""
    lines = variant({
        7: "bogus: 1",
        12: "    key: *k",
        14: '      - { name: "b\\0", algorithm: token_bucket, rate: "10/s", burst: 20 }',
        19: "    limits: *l"}, delete=(20, 21, 22, 23))
    errs = run_bad(write(tmp_path, lines))
    assert errs == [
        (7, 1, 'policy: unknown key "bogus" (expected one of: server, redis, failure_mode, '
               'trusted_proxies, client_ipv6_prefix, log, routes)'),
        (12, 10, "aliases are not allowed in a policy file"),
        (14, 17, "a NUL character (\\0) is not allowed in a value"),
        (19, 13, "aliases are not allowed in a policy file"),
    ], errs
    # a refused value standing for a whole route, or for every route
    errs = run_bad(write(tmp_path, variant({16: "  - *web", 2: "  listen: nowhere"},
                                           delete=range(17, 24))))
    assert [(l, c) for l, c, _ in errs] == [(2, 11), (16, 5)], errs
    errs = run_bad(write(tmp_path, variant({9: "routes: *all"}, delete=range(10, 24))))
    assert errs == [(9, 9, "aliases are not allowed in a policy file")], errs


def test_refusals_before_a_bare_ipv6_are_said_once(tmp_path):
    """Each parse the loader makes to step past a bare IPv6 value said the
    refusals before it again: an anchor, an alias or a NUL four times for
    three values (a review)."""
    errs = run_bad(write(tmp_path, variant({
        10: "  - name: &a api",
        14: '      - { name: "b\\0", algorithm: token_bucket, rate: "10/s", burst: 20 }',
        18: "    key: *k"}, delete=(8,)) + [
            "trusted_proxies: [::1/128, ::2/128, ::3/128]"]))
    assert [(l, c) for l, c, _ in errs] == [(9, 11), (13, 17), (17, 10)], errs


def test_missing_routes(tmp_path):
    path = write(tmp_path, BASE[:8])
    errs = run_bad(path)
    assert any("routes" in m for _, _, m in errs), errs


def test_missing_required_limit_field(tmp_path):
    path = write(tmp_path, variant(delete=(22,)))
    errs = run_bad(path)
    assert any(l in (20, 21, 22) and "limit" in m for l, _, m in errs), errs


def test_three_errors_reported_at_once(tmp_path):
    lines = variant({2: "  listen: nowhere",
                     15: "      - { name: hourly, algorithm: fixed_window, limit: 1000, window: 1x }",
                     16: "  - name: api"})
    path = write(tmp_path, lines)
    errs = run_bad(path)
    assert len(errs) == 3, errs
    assert [e[0] for e in errs] == [2, 15, 16]
    assert errs[0][1] == col_of(lines[1], "nowhere")
    assert errs[1][1] == col_of(lines[14], "1x")


def test_errors_in_many_places(tmp_path):
    lines = variant({3: "  deny_status: abc", 7: "failure_mode: maybe",
                     18: "    key: bogus", 23: "        window: 10x"},
                    insert={9: ["colour: red"]})
    path = write(tmp_path, lines)
    errs = run_bad(path)
    assert len(errs) == 5, errs
    assert [e[0] for e in errs] == [3, 7, 9, 19, 24]


def test_nonexistent_file(tmp_path):
    path = os.path.join(str(tmp_path), "nope.yaml")
    p = validate(path)
    assert p.returncode == 1
    assert path in p.stderr.decode()


@pytest.mark.parametrize("content", [
    b"", b"\n\n", b"~\n", b"42\n", b"- a\n- b\n", b"routes:\n",
    b"\x00\x01\x02\xff\xfe binary", b"\xef\xbb\xbf\xff\xfe: x\n",
    b"[" * 100000, b"{a: " * 50000, b"- " * 50000 + b"x\n",
    b"routes:\n" + b"  - name: r\n    match: {prefix: /}\n    key: ip\n"
    b"    limits: [{algorithm: fixed_window, limit: 1, window: 1s}]\n" * 2,
    b"a: b\n---\nc: d\n",
    b"routes: !!str x\n",
    b"'unterminated\n",
    b"key: \"\\x\\u12\"\n",
], ids=lambda c: repr(c[:24]))
def test_never_crashes(tmp_path, content):
    path = os.path.join(str(tmp_path), "bad.yaml")
    with open(path, "wb") as f:
        f.write(content)
    p = validate(path)
    assert p.returncode == 1, "exit %r\n%s" % (p.returncode, p.stderr[-2000:])
    for l in p.stderr.decode("utf-8", "replace").splitlines():
        if l.strip():
            assert LINE_RE.match(l) and l.startswith(path + ":"), l


@pytest.mark.parametrize("line,byte,col,says", [
    # libyaml gives these only a byte offset: the loader finds the place
    # (a trailing octet is placed where it is, one past its lead)
    (22, b"        limit: 1\xe90", 18, "invalid trailing UTF-8 octet (the file must be UTF-8)"),
    (22, b"        limit: \xc3\xa9\xff", 17, "UTF-8"),
    (14, b"      - { name: b\x01urst", 18, "control characters are not allowed"),
    (5, b"  address: 127.0.0.1:6379 # \xc3\xa9\x00", 30, "control characters"),
])
def test_bad_bytes_are_placed(tmp_path, line, byte, col, says):
    raw = [l.encode() for l in BASE]
    raw[line - 1] = byte
    path = os.path.join(str(tmp_path), "bytes.yaml")
    with open(path, "wb") as f:
        f.write(b"\n".join(raw) + b"\n")
    errs = run_bad(path)
    assert len(errs) == 1 and errs[0][:2] == (line, col) and says in errs[0][2], errs


@pytest.mark.parametrize("text", [
    '  - name: "a\\u0000b"', '  - name: "a\\0b"',
])
def test_nul_in_a_quoted_value_is_an_error(tmp_path, text):
    """C strings end at a NUL: the value in force would be cut short."""
    errs = run_bad(write(tmp_path, variant({10: text})))
    assert errs == [(10, 11, "a NUL character (\\0) is not allowed in a value")], errs


def test_crlf_file_lines_and_columns(tmp_path):
    lines = variant({23: "        window: 10x"})
    path = os.path.join(str(tmp_path), "crlf.yaml")
    with open(path, "wb") as f:
        f.write(("\r\n".join(lines) + "\r\n").encode())
    errs = run_bad(path)
    assert [(l, c) for l, c, _ in errs] == [(23, 17)], errs
    good = os.path.join(str(tmp_path), "crlf-good.yaml")
    with open(good, "wb") as f:
        f.write(("\r\n".join(BASE) + "\r\n").encode())
    assert validate(good).returncode == 0


# --- messages found by the audit of `-t` --------------------------------

def bad_text(tmp_path, text, name="policy.yaml"):
    """Writes `text` (str or bytes) and returns run_bad's (line, col, msg) list."""
    p = os.path.join(str(tmp_path), name)
    with open(p, "wb") as f:
        f.write(text if isinstance(text, bytes) else text.encode())
    return run_bad(p)


def one_route(limits, extra=""):
    """A policy with one route whose `limits:` block is `limits` (lines at
    six spaces); the first limit is on line 5, after `extra`'s lines."""
    return ("routes:\n"
            "  - name: r\n"
            "    match: { prefix: / }\n" + extra +
            "    limits:\n" + "".join("      - %s\n" % l for l in limits))


SWL = "{ algorithm: sliding_window_log, limit: %s, window: 1m }"


def test_sliding_window_log_limit_is_capped(tmp_path):
    # One sorted-set member per unit of cost: a huge limit lets one costly
    # request block Redis, so the loader refuses it, at the value.
    text = one_route([SWL % "10001"], "    key: ip\n")
    errs = bad_text(tmp_path, text)
    line = text.splitlines()[5]
    assert errs == [(6, col_of(line, "10001"),
                     "limit: sliding_window_log keeps one entry per request unit, "
                     "so at most 10000 (use sliding_window_counter for larger limits)")]
    # overrides' limits too
    text = one_route([SWL % "5"]) + \
        "    overrides:\n      - { keys: [k], limits: [ %s ] }\n" % (SWL % "1000000000000")
    errs = bad_text(tmp_path, text)
    assert [(l, m.split(" keeps")[0]) for l, _, m in errs] == [(7, "limit: sliding_window_log")]
    # the cap itself is fine, and other window algorithms keep the wide range
    path = write(tmp_path, one_route([SWL % "10000",
        "{ algorithm: sliding_window_counter, limit: 1000000000000, window: 1m }"]).splitlines())
    p = validate(path)
    assert p.returncode == 0, p.stderr.decode()


IPV6_HINT = ' (quote IPv6 addresses: "::1/128", "[::1]:8080")'


@pytest.mark.parametrize("lines", [
    # the SPEC's own example: YAML 1.1 cannot start a plain scalar with ':'
    # inside a flow collection, which the loader gets past
    variant({8: "trusted_proxies: [127.0.0.1/32, ::1/128]"}),
    variant({8: "trusted_proxies: [::1/128,127.0.0.1/32]"}),
    variant({8: "trusted_proxies: ["}, insert={9: ["  127.0.0.1/32,", "  ::1/128", "]"]}),
])
def test_bare_ipv6_in_a_flow_list_loads(tmp_path, lines):
    p = validate(write(tmp_path, lines))
    assert p.returncode == 0, p.stderr.decode()


def test_bare_ipv6_in_a_flow_list_is_the_address(start_daemon):
    """The colon the loader stepped past is back in the value."""
    import requests
    from helpers import policy
    d = start_daemon(policy("  - name: r\n    match: {prefix: /}\n    limits: [{algorithm: "
                            "fixed_window, limit: 5, window: 1m}]\n",
                            top="trusted_proxies: [::1/128,   2001:db8::/32]\n"))
    v = requests.get(d.url("/v1/policy"), timeout=5).json()
    assert v["trusted_proxies"] == ["::1/128", "2001:db8::/32"], v


def test_bare_ipv6_past_the_64_the_loader_steps_over_is_where_to_quote(tmp_path):
    """64 bare values load (the README's bound); past them the error named
    the first value on the line, which had loaded, not the 65th."""
    def bare(n):
        return "trusted_proxies: [%s]" % ", ".join("::%x/128" % (i + 1) for i in range(n))
    p = validate(write(tmp_path, variant({8: bare(64)})))
    assert p.returncode == 0, p.stderr.decode()
    line = bare(66)
    errs = run_bad(write(tmp_path, variant({8: line})))
    assert len(errs) == 1, errs
    assert errs[0][:2] == (8, line.index("::41/128") + 1), (errs, line.index("::41/128") + 1)
    assert errs[0][2].endswith(IPV6_HINT), errs


def test_bare_ipv6_error_is_where_the_value_is(tmp_path):
    errs = run_bad(write(tmp_path, variant({8: "trusted_proxies: [10.0.0.1, ::zz]"})))
    assert errs == [(8, 29, 'trusted_proxies: "::zz" is not an IP address or CIDR range')], errs
    errs = run_bad(write(tmp_path, variant({8: "trusted_proxies: { a: ::1 }"})))
    assert [(l, c) for l, c, _ in errs] == [(8, 18)], errs



@pytest.mark.parametrize("lineno,text,token", [
    # a flow list followed by more text: no reading makes it an address
    (2, "  listen: [::1]:8080", "::1]"),
    (2, "  listen: [fe80::1]:8080   # link-local", "]:8080"),
    (5, "  address: [::1]:6379", "::1]"),
])
def test_yaml_error_on_bare_ipv6_hints_at_quotes(tmp_path, lineno, text, token):
    lines = variant({lineno: text})
    errs = run_bad(write(tmp_path, lines))
    assert len(errs) == 1, errs
    line, col, msg = errs[0]
    # the error keeps libyaml's position; the hint is appended
    assert (line, col) == (lineno, col_of(text, token) + (token == "]:8080")), errs
    assert msg.startswith("YAML syntax error: ") and msg.endswith(IPV6_HINT), errs


@pytest.mark.parametrize("lineno,text", [
    (18, "    key: ip: x"),                                      # not an address
    (8, "trusted_proxies: ['::1/128', ] ]"),                    # quoted, error after it
    (8, "trusted_proxies: [\"::1/128\"] x   # not [::1]"),       # error on another word
    (8, "trusted_proxies: [\"::1/128\", 10.0.0.1}"),
])
def test_yaml_error_without_bare_ipv6_has_no_hint(tmp_path, lineno, text):
    errs = run_bad(write(tmp_path, variant({lineno: text})))
    assert errs and all("YAML syntax error" in m and "IPv6" not in m for _, _, m in errs), errs


FW = "{ name: %s, algorithm: fixed_window, limit: 1, window: 1s }"


def test_duplicate_limit_name_points_at_the_duplicate(tmp_path):
    lines = BASE[:13] + ["      - " + FW % n for n in ("a", "b", "b")]
    errs = run_bad(write(tmp_path, lines))
    assert errs == [(16, col_of(lines[15], "b,"), 'limits: two limits are named "b" '
                     '(the first at 15:%d)' % col_of(lines[14], "b,"))], errs


def test_duplicate_default_limit_name_points_at_the_later_limit(tmp_path):
    # unnamed limits are named after their algorithm, then -2, -3...
    unnamed = "{ algorithm: fixed_window, limit: 2, window: 1m }"
    errs = bad_text(tmp_path, one_route([unnamed, unnamed, FW % "fixed_window-2"]))
    assert errs == [(7, 17, 'limits: two limits are named "fixed_window-2" '
                     '(the first at 6:9)')], errs
    errs = bad_text(tmp_path, one_route([FW % "fixed_window-2", unnamed]))
    assert errs == [(6, 9, 'limits: two limits are named "fixed_window-2" '
                     '(this one by default, after its algorithm; the first at 5:17)')], errs


# Each line puts a control byte (YAML escape \x01) into a value that the
# error message echoes.
@pytest.mark.parametrize("lineno,text", [
    (18, r'    key: "header:X\x01"'),
    (18, r'    key: "bogus\x01"'),
    (22, r'        limit: "5\x01"'),
    (3, r'  ietf_headers: "yes\x01"'),
    (23, r'        window: "1\x01s"'),
    (6, r'  timeout: "1s\x01"'),
    (9, r'"colour\x01": red'),
    (2, r'  listen: "nowhere\x01"'),
    (5, r'  address: "127.0.0.1:1\x01"'),
    (7, r'failure_mode: "open\x01"'),
    (21, r'        algorithm: "fixed_window\x01"'),
    (14, r'      - { name: burst, algorithm: token_bucket, rate: "10/s\x01", burst: 20 }'),
    (11, r'    match: { prefix: "api\x01", methods: [GET, POST] }'),
    (11, r'    match: { prefix: /api/, methods: ["G\x01T"] }'),
    (17, r'    match: { regex: "^/v[0-9+/\x01" }'),
    (16, r'  - name: "api\x01"'),
    (8, r'trusted_proxies: [127.0.0.1/32, "::1/128\x01"]'),
])
def test_messages_escape_user_strings(tmp_path, lineno, text):
    lines = variant({lineno: text})
    if lineno == 9:
        lines = variant(insert={9: [text]})
    path = write(tmp_path, lines)
    p = validate(path)
    assert p.returncode == 1
    err = p.stderr
    assert not [b for b in err if b < 0x20 and b != 0x0a], err
    assert b"\\x01" in err, err
    run_bad(path)


def test_duplicate_of_an_invalid_route_name_is_escaped(tmp_path):
    lines = variant({10: r'  - name: "a\x01"', 16: r'  - name: "a\x01"'})
    errs = run_bad(write(tmp_path, lines))
    assert (16, 11, r'route: duplicate route name "a\x01" (first at 10:11)') in errs, errs


def test_each_duplicate_route_name_is_one_error_naming_the_first(tmp_path):
    """n copies of a name are n-1 errors, each naming the first copy (every
    earlier copy was named: 1,000 copies gave 499,500 lines)."""
    path = tmp_path / "dup.yaml"
    path.write_text("routes:\n" + "".join(
        "  - {name: a, match: {prefix: /%d}, key: global, limits: "
        "[{algorithm: fixed_window, limit: 1, window: 1s}]}\n" % i for i in range(300)))
    p = validate(str(path))
    assert p.returncode == 1
    out = p.stderr.decode().splitlines()
    lines = [l for l in out if "duplicate route name" in l]
    # 299 errors: the first 100 said, then how many more (a file of
    # 200,000 unknown keys printed as many lines)
    assert len(lines) == 100, len(lines)
    assert all(l.endswith('"a" (first at 2:12)') for l in lines), lines[:3]
    # the count is a FILE:LINE:COL line too, at the first error not said
    # (it had no place, and a tool reading every line as one choked on it)
    assert out[100] == "%s:103:12: ... and 199 more errors from here on" % path, out[-3:]
    assert len(run_bad(str(path))) == 101
    # one more: an error, not "1 more errors"
    path.write_text("\n".join(path.read_text().splitlines()[:103]) + "\n")
    out = validate(str(path)).stderr.decode().splitlines()
    assert out[100] == "%s:103:12: ... and 1 more error from here on" % path, out[-3:]


def test_long_values_are_cut_in_messages(tmp_path):
    lines = variant({18: "    key: bogus" + "x" * 2000})
    errs = run_bad(write(tmp_path, lines))
    assert len(errs) == 1 and '"bogus' in errs[0][2] and 'xxx..."' in errs[0][2], errs
    assert len(errs[0][2]) < 400, errs


@pytest.mark.parametrize("lineno,text,token,msg", [
    (22, '        limit: "5"', '"5"',
     'limit: expected an integer, got the string "5" (remove the quotes)'),
    (3, "  deny_status: '403'", "'403'",
     'deny_status: expected an integer, got the string "403" (remove the quotes)'),
    (3, '  ietf_headers: "true"', '"true"',
     'ietf_headers: expected true or false, got the string "true" (remove the quotes)'),
    # a boolean where text goes is a type mixed up, and a leading zero is
    # octal to YAML 1.1 readers: neither is guessed at
    (10, "  - name: true", "true",
     'name: expected text, got the boolean true (quote it if you mean the word: "true")'),
    (11, "    match: { prefix: /api/, methods: [GET, False] }", "False",
     'methods: expected text, got the boolean False (quote it if you mean the word: "False")'),
    (22, "        limit: 010", "010",
     'limit: "010" has a leading zero, which YAML 1.1 reads as octal: write 10 without it'),
    (3, "  deny_status: -0429", "-0429",
     'deny_status: "-0429" has a leading zero, which YAML 1.1 reads as octal: '
     'write -429 without it'),
    # quotes are not the problem here, so no advice to remove them
    (22, '        limit: "many"', '"many"', 'limit: expected an integer, got the string "many"'),
    (22, "        limit: many", "many", 'limit: expected an integer, got "many"'),
])
def test_quoted_numbers_and_booleans_say_they_are_strings(tmp_path, lineno, text, token, msg):
    errs = run_bad(write(tmp_path, variant({lineno: text})))
    assert errs == [(lineno, col_of(text, token), msg)], errs


@pytest.mark.parametrize("lineno,text,value,rng", [
    (22, "        limit: 9223372036854775808", "9223372036854775808", "[1, 1000000000000]"),
    (22, "        limit: 99999999999999999999999", "99999999999999999999999",
     "[1, 1000000000000]"),
    (22, "        limit: -99999999999999999999999", "-99999999999999999999999",
     "[1, 1000000000000]"),
    (3, "  deny_status: 18446744073709551616", "18446744073709551616", "[400, 599]"),
    # what values that fit in 64 bits already got
    (22, "        limit: 1000000000001", "1000000000001", "[1, 1000000000000]"),
])
def test_huge_integers_are_out_of_range(tmp_path, lineno, text, value, rng):
    key = text.split(":")[0].strip()
    errs = run_bad(write(tmp_path, variant({lineno: text})))
    assert errs == [(lineno, col_of(text, value), "%s: %s is out of range %s" % (key, value, rng))], errs


WHOLE = "durations are whole numbers of a unit (ms, s, m, h or d)"


@pytest.mark.parametrize("lineno,text,token,msg", [
    (23, '        window: "1.5s"', '"1.5s"', 'window: "1.5s": %s; write 1500ms' % WHOLE),
    (23, "        window: 1.5m", "1.5m", 'window: "1.5m": %s; write 90s' % WHOLE),
    (23, "        window: 0.5d", "0.5d", 'window: "0.5d": %s; write 12h' % WHOLE),
    (23, "        window: .25s", ".25s", 'window: ".25s": %s; write 250ms' % WHOLE),
    (6, "  timeout: 0.05s", "0.05s", 'timeout: "0.05s": %s; write 50ms' % WHOLE),
    (23, "        window: 1.5.3m", "1.5.3m", 'window: "1.5.3m": %s, such as 1500ms' % WHOLE),
    (23, "        window: 0.5ms", "0.5ms", 'window: "0.5ms": %s, and 1ms is the smallest' % WHOLE),
    (23, "        window: 0.0s", "0.0s", 'window: "0.0s": %s, greater than zero' % WHOLE),
    (14, '      - { name: burst, algorithm: token_bucket, rate: "10/1.5s", burst: 20 }',
     '"10/1.5s"', 'rate: "10/1.5s": %s; write "10/1500ms"' % WHOLE),
    (14, '      - { name: burst, algorithm: token_bucket, rate: "10/.5s", burst: 20 }',
     '"10/.5s"', 'rate: "10/.5s": %s; write "10/500ms"' % WHOLE),
    # not a fraction: the unit is the problem
    (23, "        window: 10x", "10x", 'window: "10x": unknown duration unit (use ms, s, m, h or d)'),
])
def test_fractional_durations_say_whole_numbers(tmp_path, lineno, text, token, msg):
    errs = run_bad(write(tmp_path, variant({lineno: text})))
    assert errs == [(lineno, col_of(text, token), msg)], errs


def test_directory_says_it_is_a_directory(tmp_path):
    path = str(tmp_path)
    assert run_bad(path) == [(1, 1, "is a directory, not a policy file")]


def test_read_error_names_the_cause(tmp_path):
    # reading /proc/self/mem at offset 0 fails with EIO after a good open
    assert run_bad("/proc/self/mem") == [(1, 1, "cannot read: Input/output error")]


def test_missing_and_unreadable_files_say_why(tmp_path):
    missing = os.path.join(str(tmp_path), "nope.yaml")
    assert run_bad(missing) == [(1, 1, "cannot open: No such file or directory")]
    path = write(tmp_path, BASE)
    os.chmod(path, 0)
    if os.geteuid() != 0:
        assert run_bad(path) == [(1, 1, "cannot open: Permission denied")]
        return
    # root reads anything, so try as nobody (who cannot reach tmp_path
    # either: the same EACCES)
    setpriv = "/usr/bin/setpriv"
    if not os.path.exists(setpriv):
        pytest.skip("running as root without setpriv")
    import subprocess
    from helpers import BIN
    p = subprocess.run([setpriv, "--reuid=65534", "--regid=65534", "--clear-groups",
                        BIN, "-t", "-c", path], capture_output=True, timeout=10)
    assert p.returncode == 1
    assert p.stderr.decode() == "%s:1:1: cannot open: Permission denied\n" % path


def test_unterminated_quote_says_where_the_scalar_starts(tmp_path):
    lines = ["server:", "  listen: 127.0.0.1:8080", "redis:", "  address: 127.0.0.1:6379",
             "routes:", "  - name: r", "    match: { prefix: / }", '    key: "ip',
             "    limits:", "      - { algorithm: fixed_window, limit: 1, window: 1s }",
             "  # end"]
    errs = run_bad(write(tmp_path, lines))
    # libyaml finds out at the end of the file; that position stays
    assert errs == [(12, 1, "YAML syntax error: found unexpected end of stream while "
                     "scanning a quoted scalar (the quoted scalar starts at 8:10)")], errs


def test_unclosed_flow_list_says_where_it_starts(tmp_path):
    lines = variant({12: "    key: [header:X-Api-Key, ip"})
    errs = run_bad(write(tmp_path, lines))
    assert errs == [(13, 11, "YAML syntax error: did not find expected ',' or ']' while "
                     "parsing a flow sequence (the flow sequence starts at 12:10)")], errs


def test_syntax_error_within_one_line_adds_no_start(tmp_path):
    errs = run_bad(write(tmp_path, variant({18: "    key: ip: x"})))
    assert errs == [(18, 12, "YAML syntax error: mapping values are not allowed "
                     'in this context (quote a value that contains ": " or ends in ":")')], errs


def test_default_precision_too_fine_says_it_is_the_default(tmp_path):
    errs = bad_text(tmp_path, one_route(
        ["{ algorithm: sliding_window_counter, limit: 5, window: 5ms }"]))
    assert errs == [(5, 9, "precision: the default, window/10 = 0.5ms, is under the "
                     "1ms minimum; set precision (1ms or more, dividing the window "
                     "evenly) or use a window of 10ms or more")], errs
    # with it set, the window works
    path = write(tmp_path, one_route(
        ["{ algorithm: sliding_window_counter, limit: 5, window: 5ms, precision: 1ms }"]).splitlines())
    assert validate(path).returncode == 0


@pytest.mark.parametrize("window,precision,says", [
    ("1m", "7s", "precision: 7s does not divide the window, 1m, evenly: the window "
                 "must be a whole number of buckets"),
    ("1m", "2m", "precision: 2m is longer than the window, 1m"),
    ("1m", "1ms", "precision: 1ms makes 60000 buckets of the window, 1m; at most 1000, "
                  "so at least 60ms"),
])
def test_explicit_precision_says_which_rule(tmp_path, window, precision, says):
    """One message served three mistakes, naming neither the window nor
    the rule (found by an audit)."""
    text = one_route(["{ algorithm: sliding_window_counter, limit: 5, window: %s, "
                      "precision: %s }" % (window, precision)])
    errs = bad_text(tmp_path, text)
    assert errs == [(5, col_of(text.splitlines()[4], "precision: ") + 11, says)], errs


def test_too_many_limits_or_routes_points_at_the_first_too_many(tmp_path):
    errs = bad_text(tmp_path, one_route(["{ algorithm: fixed_window, limit: 1, window: %ds }"
                                         % (i + 1) for i in range(18)]))
    assert errs == [(21, 9, "limits[16]: one too many: at most 16 limits per route, and "
                            "this route has 18")], errs
    # What is wrong past the cap is said in the same run (an audit found
    # limits 17 and on unread), and so is a name used twice across it.
    limits = ["{ algorithm: fixed_window, limit: 1, window: %ds }" % (i + 1) for i in range(18)]
    limits[17] = "{ algorithm: fixed_window, limit: 1, window: 1 minute }"
    limits[16] = "{ name: fixed_window, algorithm: gcra, rate: 1/s, burst: 1 }"
    errs = bad_text(tmp_path, one_route(limits))
    assert [e[:2] for e in errs] == [(21, 9), (21, 17), (22, 54)], errs
    assert "two limits are named \"fixed_window\"" in errs[1][2], errs
    assert "window: \"1 minute\"" in errs[2][2], errs
    text = "routes:\n" + "".join(
        "  - { name: r%d, match: { path: /%d }, limits: [{ algorithm: fixed_window, "
        "limit: 1, window: 1s }] }\n" % (i, i) for i in range(1001))
    errs = bad_text(tmp_path, text)
    assert errs == [(1002, 5, "routes[1000]: one too many: at most 1000 routes, and this "
                              "file has 1001")], errs


def test_workers_word_names_auto(tmp_path):
    errs = run_bad(write(tmp_path, variant({3: "  workers: AUTO"})))
    assert errs == [(3, 12, 'workers: expected a number of threads (1 to 64) or auto, '
                            'got "AUTO"')], errs


def test_errors_come_in_file_order(tmp_path):
    text = ("server:\n"
            "  listen: nowhere\n"                                                   # 2
            "routes:\n"
            "  - name: r\n"                                                         # 4
            "    match: { prefix: x }\n"                                            # 5
            "  - name: s\n"
            "    limits:\n"
            "      - { name: b, algorithm: fixed_window, window: 1x, limit: 0 }\n"  # 8
            "      - { name: c, algorithm: fixed_window, limit: 1, window: 1s }\n"  # 9
            "      - { name: c, algorithm: fixed_window, limit: 1, window: 1s }\n"  # 10
            "      - { name: d, algorithm: fixed_window, limit: 1, window: 1z }\n"  # 11
            "      - { name: e, algorithm: fixed_window }\n")                       # 12
    errs = bad_text(tmp_path, text)
    lines = text.splitlines()

    def at(lineno, token):
        return (lineno, col_of(lines[lineno - 1], token))
    assert [(l, c, m.split(":")[0]) for l, c, m in errs] == [
        at(2, "nowhere") + ("listen",),
        at(4, "name") + ("route",),     # "limits" is required, found after line 5's error
        at(5, "x }") + ("prefix",),
        at(8, "1x") + ("window",),      # checked after limit, but comes first
        at(8, "0 }") + ("limit",),
        at(10, "c,") + ("limits",),     # the duplicate, found after line 11's error
        at(11, "1z") + ("window",),
        at(12, "{") + ("limits[4]",),       # two errors at one position keep their order
        at(12, "{") + ("limits[4]",),
    ], errs
    assert 'requires "limit"' in errs[-2][2] and 'requires "window"' in errs[-1][2], errs


def test_missing_routes_comes_first(tmp_path):
    errs = bad_text(tmp_path, "server:\n  listen: nowhere\n")
    assert [(l, c) for l, c, _ in errs] == [(1, 1), (2, 11)], errs
    assert "routes" in errs[0][2]


# ---------------------------------------------------------------- match
# values that can never match a request are errors, not silent no-ops
# (an audit found each loaded by -t and then never applied)

@pytest.mark.parametrize("match,col,says", [
    ("{ path: /a/../b }", 20, 'path: "/a/../b" can never match: requests are matched on '
                              'their normalized path (// merged, . and .. segments '
                              'resolved); write "/b"'),
    ("{ path: /a//b }", 20, 'write "/a/b"'),
    ("{ path: /a/. }", 20, 'write "/a/"'),
    ("{ prefix: /x/./y/ }", 22, 'write "/x/y/"'),
    ("{ prefix: /x//y }", 22, 'write "/x/y"'),
    ('{ prefix: /, host: "" }', 31, 'host: empty; leave "host" out to match every host'),
    ("{ prefix: /, methods: [] }", 34, 'methods: an empty list; leave "methods" out'),
    ('{ regex: "%s" }' % ("(a|b)*" * 700), 21, "regex: 4200 bytes long; at most 4096"),
])
def test_match_that_can_never_match_is_an_error(tmp_path, match, col, says):
    text = one_route(["{ algorithm: fixed_window, limit: 1, window: 1m }"]).replace(
        "{ prefix: / }", match)
    errs = bad_text(tmp_path, text)
    assert len(errs) == 1 and errs[0][:2] == (3, col) and says in errs[0][2], errs


@pytest.mark.parametrize("match,warned", [
    ("{ path: /100% }", None), ("{ prefix: /a/b/ }", None), ('{ path: "/%00" }', None),
    ("{ path: /caf\u00e9 }", None), ('{ regex: "%s" }' % ("(a|b)*" * 680), None),
    # a prefix's last segment may be partial: dotfiles, "/static/..foo"
    ('{ prefix: "/." }', None), ("{ prefix: /static/.. }", None),
    # only a request that encodes it twice can match these: a warning
    ('{ path: "/q?x=1" }', 'did you mean "/q"?'),
    ('{ prefix: "/tags/#" }', 'did you mean "/tags/"?'),
    ("{ path: /x/%41 }", 'path: "/x/%41" matches only a request that encodes it twice: '
                         'requests are matched percent-decoded and without their query; '
                         'did you mean "/x/A"?'),
    ('{ prefix: "/a%2Fb/%2e" }', 'did you mean "/a/b/."?'),
    # UTF-8 as it can be pasted back: "\xc3\xa9" in double quotes is two
    # other characters
    ('{ path: "/caf%C3%A9" }', 'did you mean "/caf\u00e9"?'),
])
def test_match_value_that_loads(tmp_path, match, warned):
    text = one_route(["{ algorithm: fixed_window, limit: 1, window: 1m }"]).replace(
        "{ prefix: / }", match)
    path = write(tmp_path, text.splitlines())
    p = validate(path)
    assert p.returncode == 0, p.stderr.decode()
    err = p.stderr.decode()
    if warned is None:
        assert err == "", err
    else:
        assert err.startswith(path + ":3:") and ": warning: " in err and warned in err, err


def test_override_key_listed_twice_is_an_error(tmp_path):
    """Only the first override of a key applies: a second is a mistake."""
    text = one_route(["{ algorithm: fixed_window, limit: 1, window: 1m }"],
                     extra="    key: header:K\n") + (
        "    overrides:\n"
        "      - { keys: [a, b], limits: [{ algorithm: fixed_window, limit: 5, window: 1m }] }\n"
        "      - { keys: [c, a], unlimited: true }\n"
        "      - { keys: [b, b], unlimited: true }\n")
    errs = bad_text(tmp_path, text)
    assert errs == [
        (9, 21, 'overrides: client key "a" is already listed at 8:18; only its first '
                'override would apply'),
        (10, 18, 'overrides: client key "b" is already listed at 8:21; only its first '
                 'override would apply'),
        (10, 21, 'overrides: client key "b" is already listed at 8:21; only its first '
                 'override would apply')], errs
    # on a route keyed by ip, two spellings of one address are one client
    errs = bad_text(tmp_path, text.replace("header:K", "ip").replace(
        "[b, b]", '["::1", "0:0:0:0:0:0:0:1"]').replace("[c, a]", "[c]"))
    # (the keys that are no address are warned about after the error)
    assert [e[:2] for e in errs if e[2].startswith("warning: ")] == [(8, 18), (8, 21), (9, 18)]
    errs = [e for e in errs if not e[2].startswith("warning: ")]
    assert errs == [(10, 25, 'overrides: client key "0:0:0:0:0:0:0:1" is already listed '
                             'at 10:18 (the same address); only its first override would '
                             'apply')], errs
    # reported with the other errors of the route, all at once: fixing one
    # did not reveal the next
    errs = bad_text(tmp_path, text.replace("[b, b]", '[""]'))
    assert errs == [
        (9, 21, 'overrides: client key "a" is already listed at 8:18; only its first '
                'override would apply'),
        (10, 18, "keys: an empty key matches no client (an empty value is no key)")], errs
    errs = bad_text(tmp_path, text.replace("{ keys: [b, b], unlimited: true }",
                                           "{ keys: [d] }"))
    assert errs == [
        (9, 21, 'overrides: client key "a" is already listed at 8:18; only its first '
                'override would apply'),
        (10, 9, 'override: needs "limits" or "unlimited: true"')], errs


def test_a_limit_name_used_twice_is_reported_with_the_limits_errors(tmp_path):
    errs = bad_text(tmp_path, one_route([
        "{ name: a, algorithm: fixed_window, limit: 0, window: 1m }",
        "{ name: a, algorithm: fixed_window, limit: 1, window: 1m }"]))
    assert errs == [
        (5, 52, "limit: 0 is out of range [1, 1000000000000]"),
        (6, 17, 'limits: two limits are named "a" (the first at 5:17)')], errs


@pytest.mark.parametrize("value", ['"A B"', "1BAD", '""', "X-Y"])
def test_password_env_must_be_a_variable_name(tmp_path, value):
    errs = run_bad(write(tmp_path, variant(insert={6: ["  password_env: %s" % value]})))
    assert len(errs) == 1 and errs[0][:2] == (6, 17), errs
    assert "is not an environment variable name" in errs[0][2], errs
    assert value.strip('"') not in errs[0][2] or value == '""', errs


def test_a_password_put_in_place_of_a_name_is_not_echoed(tmp_path):
    """SPEC 8: the password never appears in errors. A password written
    where the variable's name belongs, or inside a redis:// URL, is the
    likeliest way for one to reach a policy file."""
    out = []
    for lines in [variant(insert={6: ['  password_env: "Hunter2 SecretB!"']}),
                  variant({5: '  address: "redis://:Hunter2SecretC@127.0.0.1:6379"'}),
                  variant({5: '  address: "redis://rl:Hunter2SecretD@[::1]:6379"'}),
                  # without a scheme: one was echoed, the other loaded and
                  # was logged and shown by /v1/policy (found by an audit)
                  variant({5: '  address: "admin:Hunter2SecretE@127.0.0.1:6379"'}),
                  variant({5: '  address: "Hunter2SecretF@127.0.0.1:6379"'})]:
        errs = run_bad(write(tmp_path, lines))
        assert len(errs) == 1, errs
        out.append(errs[0][2])
    assert not any("Hunter2" in e for e in out), out
    assert "environment variable name" in out[0], out
    assert all("URL with credentials" in e for e in out[1:3]), out
    assert all("user@host with credentials" in e for e in out[3:]), out


@pytest.mark.parametrize("value", ["'host with space:6379'", "'-h:1'", "'a/b:6379'",
                                   "'127.0.0.1: 6379'", "'127.0.0.1:+6379'"])
def test_an_address_that_cannot_resolve_is_refused(tmp_path, value):
    """It loaded, and failed only at the first connection attempt."""
    errs = run_bad(write(tmp_path, variant({5: "  address: %s" % value})))
    assert len(errs) == 1 and errs[0][:2] == (5, 12), errs
    errs = run_bad(write(tmp_path, variant({2: "  listen: %s" % value})))
    assert len(errs) == 1 and errs[0][:2] == (2, 11), errs


@pytest.mark.parametrize("port, cause", [
    (" 80", "the port must be written in digits alone, with no space or sign"),
    ("+80", "the port must be written in digits alone, with no space or sign"),
    ("80x", "the port must be written in digits alone, with no space or sign"),
    ("", "the port is missing after the last ':'"),
    ("0", "port must be from 1 to 65535"),
    ("65536", "port must be from 1 to 65535"),
    ("99999999999999999999", "port must be from 1 to 65535"),
])
def test_a_bad_port_is_named_for_what_is_wrong(tmp_path, port, cause):
    """A space before the port was refused as "port must be from 1 to
    65535", which 80 is (an audit): the message now says what to change."""
    for line, key, col in ((2, "listen", 11), (5, "address", 12)):
        errs = run_bad(write(tmp_path, variant({line: '  %s: "127.0.0.1:%s"' % (key, port)})))
        assert errs == [(line, col, '%s: "127.0.0.1:%s": %s' % (key, port, cause))], errs


def test_a_parameter_of_another_algorithm_is_reported_at_its_key(tmp_path):
    """Reported at its value, where an unknown key is reported at the key
    (an audit): the two now point alike."""
    errs = run_bad(write(tmp_path, variant(
        {14: '      - { name: burst, algorithm: token_bucket, rate: "10/s", burst: 20, '
             'window: 1m }'},
        insert={23: ["        burst: 4"]})))
    assert errs == [(14, 74, "window: not a parameter of token_bucket"),
                    (23, 9, "burst: not a parameter of fixed_window")], errs


def test_an_at_sign_in_a_socket_path_is_no_url(tmp_path):
    p = write(tmp_path, variant({5: "  address: unix:/run/redis@main/redis.sock"}))
    assert validate(p).returncode == 0, validate(p).stderr


def test_a_url_is_not_an_address(tmp_path):
    errs = run_bad(write(tmp_path, variant({5: '  address: "redis://127.0.0.1:6379"'})))
    assert len(errs) == 1 and "a URL is not an address" in errs[0][2], errs


def test_unquoted_colon_value_hints_at_quotes(tmp_path):
    errs = run_bad(write(tmp_path, variant({18: "    key: header:"})))
    assert errs == [(18, 16, 'YAML syntax error: mapping values are not allowed in this '
                             'context (quote a value that contains ": " or ends in ":")')], errs


def test_route_that_can_never_match_is_a_warning(tmp_path):
    """Loads (first match wins is the contract), but -t says which route
    takes every request the later one would match."""
    text = one_route(["{ algorithm: fixed_window, limit: 1, window: 1m }"]).replace(
        "{ prefix: / }", "{ prefix: /api }") + (
        "  - name: login\n"
        "    match: { path: /api/login, methods: [POST] }\n"
        "    limits: [{ algorithm: fixed_window, limit: 1, window: 1m }]\n"
        "  - name: other-host\n"
        "    match: { prefix: /b/, host: a.example.com }\n"
        "    limits: [{ algorithm: fixed_window, limit: 1, window: 1m }]\n"
        "  - name: get\n"
        "    match: { prefix: /g/, methods: [get, post] }\n"
        "    limits: [{ algorithm: fixed_window, limit: 1, window: 1m }]\n"
        "  - name: head\n"
        "    match: { path: /g/x, methods: [HEAD] }\n"
        "    limits: [{ algorithm: fixed_window, limit: 1, window: 1m }]\n"
        "  - name: all\n"
        "    limits: [{ algorithm: fixed_window, limit: 1, window: 1m }]\n"
        "  - name: after-all\n"
        "    match: { regex: '^/x' }\n"
        "    limits: [{ algorithm: fixed_window, limit: 1, window: 1m }]\n")
    path = write(tmp_path, text.splitlines())
    p = validate(path)
    assert p.returncode == 0 and p.stdout.decode() == path + ": ok\n", p.stderr
    warned = p.stderr.decode().splitlines()
    assert warned == [
        '%s:6:5: warning: route "login" can never match: route "r" (at 2:5) comes first '
        'and matches every request it would' % path,
        '%s:15:5: warning: route "head" can never match: route "get" (at 12:5) comes first '
        'and matches every request it would' % path,
        '%s:20:5: warning: route "after-all" can never match: route "all" (at 18:5) comes '
        'first and matches every request it would' % path], warned


def test_utf16_with_its_byte_order_mark_is_read(tmp_path):
    """YAML allows UTF-16 that starts with its BOM (as a Windows editor
    saves a file), and libyaml reads it: the README says so, and an error
    in such a file is placed at its line and column all the same."""
    text = ("routes:\n"
            "  - name: a\n"
            "    limits: [{ algorithm: fixed_window, limit: 1, window: 1m }]\n")
    path = os.path.join(str(tmp_path), "utf16.yaml")
    for encoding in ("utf-16-le", "utf-16-be"):
        with open(path, "wb") as f:
            f.write("\ufeff".encode(encoding) + text.encode(encoding))
        p = validate(path)
        assert p.returncode == 0 and p.stdout.decode() == path + ": ok\n", p.stderr
    errs = bad_text(tmp_path, "\ufeff".encode("utf-16-le")
                    + text.replace("1m", "1 m").encode("utf-16-le"))
    assert [e[:2] for e in errs] == [(3, 59)], errs


def test_a_method_no_one_sends_is_a_warning(tmp_path):
    """A misspelt GET matched no GET, and the route's requests passed
    unlimited without a word (found by an audit)."""
    text = ("routes:\n"
            "  - name: a\n"
            "    match: { prefix: /, methods: [GETT, get, PURGE, propfind, Fetch] }\n"
            "    limits: [{ algorithm: fixed_window, limit: 1, window: 1m }]\n")
    path = write(tmp_path, text.splitlines())
    p = validate(path)
    assert p.returncode == 0, p.stderr
    said = ' is no method HTTP defines (IANA\'s registry: GET, HEAD, POST, PUT, PATCH, ' \
           'DELETE, OPTIONS, WebDAV\'s...): only a request that sends it matches'
    assert p.stderr.decode().splitlines() == [
        '%s:3:35: warning: methods: "GETT"%s' % (path, said),
        '%s:3:63: warning: methods: "FETCH"%s' % (path, said)], p.stderr


@pytest.mark.parametrize("first,later,covered", [
    ("api.example.com", "API.example.com", True),
    # spellings of one host, as a request's is compared (an audit found
    # these later routes dead without a word)
    ("api.example.com", "api.example.com.", True),
    ("api.example.com.", "api.example.com", True),
    ("'[::1]'", "'::1'", True),
    ("'[2001:db8:0::1]'", "'[2001:db8::1]'", True),
    # no port in the first takes the later's requests on every port
    ("api.example.com", "api.example.com:443", True),
    ("'[2001:db8::1]'", "'[2001:db8::1]:8443'", True),
    ("api.example.com:443", "api.example.com:443", True),
    # a port in the first takes only that port's
    ("api.example.com:443", "api.example.com", False),
    ("api.example.com:443", "api.example.com:8443", False),
    ("api.example.com", "www.example.com", False),
    ("'[::1]'", "'[::2]'", False),
])
def test_a_host_covers_its_other_spellings(tmp_path, first, later, covered):
    text = ("routes:\n"
            "  - name: g\n"
            "    match: { host: %s }\n"
            "    limits: [{ algorithm: fixed_window, limit: 1, window: 1m }]\n"
            "  - name: h\n"
            "    match: { host: %s, path: /x }\n"
            "    limits: [{ algorithm: fixed_window, limit: 1, window: 1m }]\n" % (first, later))
    path = write(tmp_path, text.splitlines())
    p = validate(path)
    assert p.returncode == 0, p.stderr
    want = ['%s:5:5: warning: route "h" can never match: route "g" (at 2:5) comes first '
            'and matches every request it would' % path] if covered else []
    assert p.stderr.decode().splitlines() == want, (first, later)


def test_the_daemon_logs_the_warning(start_daemon):
    from helpers import policy
    d = start_daemon(policy(
        "  - name: a\n    match: {prefix: /}\n    limits: [{limit: 5, window: 1m, "
        "algorithm: fixed_window}]\n"
        "  - name: b\n    match: {path: /x}\n    limits: [{limit: 5, window: 1m, "
        "algorithm: fixed_window}]\n"))
    assert 'warning: route "b" can never match: route "a"' in d.log(), d.log()


def test_long_leaky_bucket_hold_is_a_warning(tmp_path):
    text = one_route(['{ name: a, algorithm: leaky_bucket, rate: "1/h", burst: 3 }',
                      '{ name: b, algorithm: leaky_bucket, rate: "10/s", burst: 20 }',
                      '{ name: c, algorithm: leaky_bucket, rate: "1/m", burst: 9, '
                      'delay: false }'])
    path = write(tmp_path, text.splitlines())
    p = validate(path)
    assert p.returncode == 0, p.stderr
    assert p.stderr.decode().splitlines() == [
        "%s:5:9: warning: leaky_bucket with delay: true holds the last of a burst 7200.0s "
        "before it answers; the gateway's timeout for the check must be longer "
        "(conf/nginx.conf waits 5s), or use delay: false" % path]


def test_limit_named_by_its_place_beside_one_of_its_algorithm_is_a_warning(tmp_path):
    """An unnamed limit is named by its place among its algorithm's limits,
    so one added above it takes its name and count (an audit: an hourly
    fixed_window became fixed_window-2 and started from zero when a daily
    one was put above it). Said wherever a list holds another limit of the
    algorithm; a lone unnamed limit and named ones are not."""
    text = one_route(['{ algorithm: fixed_window, limit: 100, window: 1d }',
                      '{ algorithm: fixed_window, limit: 5, window: 1h }',
                      '{ name: g, algorithm: gcra, rate: "1/s", burst: 3 }',
                      '{ algorithm: gcra, rate: "10/s", burst: 3 }',
                      '{ algorithm: token_bucket, rate: "10/s", burst: 3 }'])
    path = write(tmp_path, text.splitlines())
    p = validate(path)
    assert p.returncode == 0, p.stderr
    tail = ("by its place among this list's %s limits, so a %s limit added above "
            "it takes that name and its count: give each a name")
    assert p.stderr.decode().splitlines() == [
        '%s:5:9: warning: limits[0]: named "fixed_window" ' % path
        + tail % ("fixed_window", "fixed_window"),
        '%s:6:9: warning: limits[1]: named "fixed_window-2" ' % path
        + tail % ("fixed_window", "fixed_window"),
        '%s:8:9: warning: limits[3]: named "gcra-2" ' % path + tail % ("gcra", "gcra")]


def test_long_hold_on_a_shadow_route_is_no_warning(tmp_path):
    """A shadow route holds no reply, wherever its `shadow: true` stands."""
    for before, after in (("    shadow: true\n", ""), ("", "    shadow: true\n")):
        path = write(tmp_path, [
            "routes:", "  - name: r", before.rstrip("\n") or "    key: ip",
            '    limits: [{ algorithm: leaky_bucket, rate: "1/h", burst: 3 }]',
            after.rstrip("\n") or "    key: ip"])
        p = validate(path)
        assert p.returncode == 0 and p.stderr == b"", p.stderr


def test_bare_ipv6_on_a_long_line_and_an_unrelated_error_after_it(tmp_path):
    """From a review of the flow-colon step: a line over 1 KB was not read
    for it, and an error later on the line was reported at the address."""
    cidrs = ", ".join("10.%d.0.0/16" % i for i in range(80))
    p = validate(write(tmp_path, variant({8: "trusted_proxies: [%s, ::1/128]" % cidrs})))
    assert p.returncode == 0, p.stderr.decode()
    errs = run_bad(write(tmp_path, variant({8: "trusted_proxies: [::1/128, 10.0.0.1}"})))
    assert errs == [(8, 36, "YAML syntax error: did not find expected ',' or ']' while "
                            "parsing a flow sequence")], errs


def test_private_use_character_of_the_file_stays(start_daemon):
    """The loader's stand-in for a ':' is U+E000: one the file has itself
    is left alone, in a quoted value as in a plain one."""
    import requests
    from helpers import policy
    d = start_daemon(policy("  - name: r\n    match: {prefix: /}\n    key: header:K\n"
                            "    limits: [{algorithm: fixed_window, limit: 5, window: 1m}]\n"
                            '    overrides: [{keys: ["a\ue000", b\ue000], unlimited: true}]\n',
                            top="trusted_proxies: [::1/128]\n"))
    import hashlib
    v = requests.get(d.url("/v1/policy"), timeout=5).json()
    assert v["routes"][0]["overrides"][0]["keys"] == [
        "sha256:" + hashlib.sha256(k.encode()).hexdigest()[:16]
        for k in ("a\ue000", "b\ue000")], v
    assert v["trusted_proxies"] == ["::1/128"], v


def test_what_can_never_apply_is_a_warning(tmp_path):
    """Found by an audit: each loaded without a word. A range as an
    override key (client 10.1.2.3 stayed limited), a value no client of an
    ip route has, any key of a global route, a key source after one that
    is always present or listed twice, and a trusted range with address
    bits past its prefix (nginx warns too; it is stored as the network)."""
    path = write(tmp_path, [
        "trusted_proxies: [127.0.0.1/32, 10.1.2.3/8]",                       # 1
        "routes:",                                                          # 2
        "  - name: a",                                                      # 3
        "    match: {prefix: /a}",                                          # 4
        "    key: [ip, header:X]",                                          # 5
        '    overrides: [{keys: ["10.0.0.0/8", 1.2.3.4], unlimited: true}]',  # 6
        "    limits: [{algorithm: fixed_window, limit: 1, window: 1s}]",    # 7
        "  - name: b",                                                      # 8
        "    match: {prefix: /b}",                                          # 9
        '    key: [header:X-A, "header:x-a", global, query:q]',             # 10
        "    limits: [{algorithm: fixed_window, limit: 1, window: 1s}]",    # 11
        "  - name: c",                                                      # 12
        "    match: {prefix: /c}",                                          # 13
        "    key: global",                                                  # 14
        '    overrides: [{keys: [a, "*"], unlimited: true}]',               # 15
        "    limits: [{algorithm: fixed_window, limit: 1, window: 1s}]",    # 16
        "  - name: d",                                                      # 17
        "    match: {prefix: /d}",                                          # 18
        "    key: ip",                                                      # 19
        '    overrides: [{keys: [partner-1, unix, "::1"], unlimited: true}]',  # 20
        "    limits: [{algorithm: fixed_window, limit: 1, window: 1s}]",    # 21
    ])
    p = validate(path)
    assert p.returncode == 0 and p.stdout.decode() == path + ": ok\n", p.stderr
    assert p.stderr.decode().splitlines() == ["%s:%s: warning: %s" % ((path,) + tuple(
        w.split(": ", 1))) for w in (
        '1:33: trusted_proxies: "10.1.2.3/8" has address bits past its prefix: it is the '
        'range 10.0.0.0/8',
        '5:15: key: "header:X" is never used: "ip" (at 5:11) comes first and is always '
        'present',
        '6:25: overrides: "10.0.0.0/8" is a range, and a key is one client: list its '
        'addresses',
        '10:23: key: "header:x-a" is never used: it is listed at 10:11',
        '10:45: key: "query:q" is never used: "global" (at 10:37) comes first and is '
        'always present',
        '15:25: overrides: "a" never applies: route "c" is keyed by global, one client '
        'for every request',
        '20:25: overrides: "partner-1" applies to no request: route "d" is keyed by ip, '
        'and it is not an IP address (only a /v1/check that names it as the key gets '
        'it)')], p.stderr.decode()



def test_override_warnings_come_with_a_duplicate_key_error(tmp_path):
    """The file's warnings come after its errors: a range among a route's
    override keys was warned about only once a key listed twice there was
    fixed (an audit)."""
    path = write(tmp_path, [
        "routes:",
        "  - name: a",
        "    key: ip",
        "    limits: [{ algorithm: fixed_window, limit: 1, window: 1m }]",
        "    overrides:",
        "      - keys: ['10.0.0.0/8', 10.1.1.1, 10.1.1.1]",
        "        limits: [{ algorithm: fixed_window, limit: 5, window: 1m }]"])
    p = validate(path)
    assert p.returncode == 1
    assert p.stderr.decode().splitlines() == [
        '%s:6:40: overrides: client key "10.1.1.1" is already listed at 6:30; only its '
        'first override would apply' % path,
        '%s:6:16: warning: overrides: "10.0.0.0/8" is a range, and a key is one client: '
        'list its addresses' % path], p.stderr.decode()

@pytest.mark.parametrize("lineno,text,token", [
    (12, "    key: ['cookie:a=b', ip]", "'cookie:a=b'"),
    (12, "    key: ['cookie:a;b', ip]", "'cookie:a;b'"),
    (8, "trusted_proxies: ['1.2.3.4/ 8']", "'1.2.3.4/ 8'"),
    (8, "trusted_proxies: ['1.2.3.4/+8']", "'1.2.3.4/+8'"),
])
def test_names_and_prefixes_are_read_whole(tmp_path, lineno, text, token):
    """A cookie name is a token (RFC 6265): "cookie:a=b" is never found. A
    prefix length strtol read past a space or a sign loaded."""
    errs = run_bad(write(tmp_path, variant({lineno: text})))
    assert len(errs) == 1 and errs[0][:2] == (lineno, col_of(text, token)), errs


@pytest.mark.parametrize("lineno,text", [
    # glibc reads "*" as every address, and the daemon listened there
    (2, "  listen: '*:8080'"),
    # PHP's cart[1] is no RFC 6265 token, but browsers send it
    (12, "    key: ['cookie:cart[1]', ip]"),
    (11, "    match: { prefix: /api/, host: 'api-1.example.com:8443' }"),
])
def test_forms_that_worked_still_load(tmp_path, lineno, text):
    """From a review: these loaded and worked before stricter checks. (-t
    says of an address beyond loopback what starting says: a warning.)"""
    p = validate(write(tmp_path, variant({lineno: text})))
    err = p.stderr.decode()
    if "*:8080" in text:
        assert err.endswith(": warning: server.listen *:8080 reaches beyond loopback: "
                            "whoever can connect can ask checks, and so charge any "
                            "client's limits; keep the port to the gateway's network\n"), err
        assert err.count("\n") == 1, err
        err = ""
    assert p.returncode == 0 and err == "", err


def test_an_unresolvable_listen_is_an_error_at_its_place(tmp_path):
    """-t resolves server.listen, as nginx -t resolves its listen
    addresses: a host that does not resolve passed, and the daemon then
    would not start. It was said as "FILE: message", the one error
    without LINE:COL, and after the warnings; an address beyond loopback
    warned without a place too."""
    text = "  listen: nosuchhost.invalid:8080"
    path = write(tmp_path, variant({2: text}))
    errs = run_bad(path)
    assert len(errs) == 1 and errs[0][:2] == (2, col_of(text, "nosuch")), errs
    assert errs[0][2].startswith('server.listen "nosuchhost.invalid:8080": '), errs
    assert b": ok" not in validate(path).stdout
    # with a warning: the error comes first, as for any refused file
    path = write(tmp_path, ["server:", text, "routes: []"], "empty.yaml")
    errs = run_bad(path)
    assert [e[:2] for e in errs] == [(2, 11), (3, 9)], errs
    assert errs[1][2].startswith("warning: routes: the list is empty"), errs
    text = "  listen: 10.1.2.3:8080"
    p = validate(write(tmp_path, variant({2: text}), "far.yaml"))
    err = p.stderr.decode()
    assert p.returncode == 0 and err.startswith(
        "%s:2:11: warning: server.listen 10.1.2.3:8080 reaches beyond loopback"
        % os.path.join(str(tmp_path), "far.yaml")), err


@pytest.mark.parametrize("host,says", [
    ("'-bad.example'", "not a host"), ("'example.com:080'", "not a host"),
    ("'b\u00fccher.example'", "xn-- form"),
])
def test_hosts_no_request_names(tmp_path, host, says):
    text = "    match: { prefix: /api/, host: %s }" % host
    errs = run_bad(write(tmp_path, variant({11: text})))
    assert len(errs) == 1 and errs[0][:2] == (11, col_of(text, host)) and says in errs[0][2], errs


@pytest.mark.parametrize("cidr,family", [
    ("0.0.0.0/0", "IPv4"), ("'::/0'", "IPv6"), ("'::ffff:0:0/96'", "IPv4")])
def test_trusting_a_whole_family_is_a_warning(tmp_path, cidr, family):
    """::ffff:0:0/96 matched nothing before mapped ranges were read as
    IPv4; now it is 0.0.0.0/0, so say what it trusts (from a review)."""
    path = write(tmp_path, variant({8: "trusted_proxies: [%s]" % cidr}))
    p = validate(path)
    assert p.returncode == 0, p.stderr
    assert p.stderr.decode() == "%s:8:19: warning: trusted_proxies: \"%s\" trusts every " \
        "%s address: any client of that family can name its own address in " \
        "X-Forwarded-For\n" % (path, cidr.strip("'"), family), p.stderr.decode()


def test_ranges_already_trusted_and_no_routes_are_warnings(tmp_path):
    """Both loaded without a word: a trusted range inside one listed before
    it (a duplicate, or the mapped form folded to IPv4) reads as though it
    meant something, and an empty route list limits nothing."""
    path = write(tmp_path, [
        "trusted_proxies: [10.0.0.0/8, 127.0.0.1/32, 10.1.0.0/16, 127.0.0.1,",
        "                  '::ffff:127.0.0.1', 10.0.0.0/8, 192.168.0.0/16, '::1']",
        "routes: []",
    ])
    p = validate(path)
    assert p.returncode == 0 and p.stdout.decode() == path + ": ok\n", p.stderr
    assert p.stderr.decode().splitlines() == ["%s:%s: warning: %s" % (path, at, w) for at, w in (
        ("1:45", 'trusted_proxies: "10.1.0.0/16" is already trusted: item 1 covers it'),
        ("1:58", 'trusted_proxies: "127.0.0.1" is already trusted: item 2 covers it'),
        ("2:19", 'trusted_proxies: "::ffff:127.0.0.1" is already trusted: item 2 covers it'),
        ("2:39", 'trusted_proxies: "10.0.0.0/8" is already trusted: item 1 covers it'),
        ("3:9", "routes: the list is empty: every check is answered 200, no request "
         "is limited"))], p.stderr.decode()


def test_a_wider_range_after_a_narrower_one_is_no_warning(tmp_path):
    path = write(tmp_path, [
        "trusted_proxies: [10.1.0.0/16, 10.0.0.0/8, '::1', '::/0']",
        "routes:",
        "  - name: a",
        "    match: {prefix: /}",
        "    key: ip",
        "    limits: [{algorithm: fixed_window, limit: 1, window: 1s}]",
    ])
    p = validate(path)
    assert p.returncode == 0 and "already trusted" not in p.stderr.decode(), p.stderr


def test_common_slips_get_advice(tmp_path):
    """A tab, a key glued to its value, a number written 1,000: libyaml's
    words or the schema's say where, the advice says what to change."""
    errs = bad_text(tmp_path, "routes:\n\t- name: api\n")
    assert errs == [(2, 1, "YAML syntax error: found character that cannot start any "
                           "token while scanning for the next token (a tab: YAML "
                           "indents with spaces only)")], errs
    errs = bad_text(tmp_path, "failure_mode:closed\nroutes:\n  - name: a\n")
    assert errs == [(2, 7, "YAML syntax error: mapping values are not allowed in this "
                           "context (line 1: a key needs a space after its colon: "
                           "\"failure_mode: closed\")")], errs
    errs = bad_text(tmp_path, "server:\n  workers:2\n" + one_route(
        ["{ algorithm: fixed_window, limit: 1,000, window: 1m }"]))
    assert errs == [
        (2, 3, 'server: expected a mapping, got a scalar (a key needs a space after '
               'its colon: "workers: 2")'),
        (7, 45, 'limits[0]: unknown key "000" (expected one of: name, algorithm, limit, '
                'window, precision, rate, burst, delay; a number takes no thousands '
                'separator: 1000, not 1,000)')], errs


def test_a_fifo_with_nothing_written_says_so(tmp_path):
    fifo = os.path.join(str(tmp_path), "policy.yaml")
    os.mkfifo(fifo)
    assert run_bad(fifo) == [(1, 1, "is a FIFO with no writer or nothing written: a "
                                    "policy is read from it once, at each load")]



def test_a_glob_loads_with_a_warning_and_an_empty_regex_is_refused(tmp_path):
    """"/api/*" as Traefik means it matched only a path with a '*' in it,
    silently; an empty regex matched every path, silently. Warnings are
    said along with the errors of the same file, not at the next run."""
    lim = "    limits: [{algorithm: fixed_window, limit: 1, window: 1s}]\n"
    path = tmp_path / "glob.yaml"
    path.write_text("routes:\n  - name: a\n    match: {path: '/api/*'}\n" + lim +
                    "  - name: b\n    match: {regex: ''}\n" + lim)
    p = validate(str(path))
    err = p.stderr.decode()
    assert p.returncode == 1, err
    assert "glob.yaml:6:20: regex: must not be empty (it would match every path)" in err, err
    assert ("glob.yaml:3:19: warning: path: \"/api/*\": '*' is no wildcard here, it "
            "matches only a '*' in the path; for everything under /api/ write "
            "prefix: \"/api/\"") in err, err
    path.write_text("routes:\n  - name: a\n    match: {prefix: '/v*/x'}\n" + lim)
    p = validate(str(path))
    assert p.returncode == 0 and "for a pattern write a regex" in p.stderr.decode(), p


def test_an_override_key_with_surrounding_spaces_loads_with_a_warning(tmp_path):
    """HTTP strips a header value's surrounding spaces: " k1" loaded and
    never applied to the client sending "k1"."""
    path = tmp_path / "ws.yaml"
    path.write_text("routes:\n  - name: a\n    key: header:X-Api-Key\n"
                    "    limits: [{algorithm: fixed_window, limit: 1, window: 1s}]\n"
                    "    overrides: [{keys: [' k1', k2], unlimited: true}]\n")
    p = validate(str(path))
    err = p.stderr.decode()
    assert p.returncode == 0, err
    assert ("ws.yaml:5:25: warning: overrides: \" k1\" begins or ends with a space "
            "or tab") in err and "k2" not in err, err


def test_pcre_groups_and_a_password_in_the_file_say_what_to_write(tmp_path):
    """glibc said only "Invalid preceding regular expression" of (?i), and
    `password:` under redis was a bare unknown key."""
    path = tmp_path / "pcre.yaml"
    path.write_text("redis: {password: hunter2}\nroutes:\n  - name: a\n"
                    "    match: {regex: '(?i)^/login'}\n"
                    "    limits: [{algorithm: fixed_window, limit: 1, window: 1s}]\n")
    p = validate(str(path))
    err = p.stderr.decode()
    assert p.returncode == 1, err
    assert "pcre.yaml:4:20: regex: \"(?i)^/login\": \"(?\" at byte 1 opens a PCRE group" in err, err
    assert "write [Aa] for either case" in err, err
    assert ("pcre.yaml:1:9: redis: unknown key \"password\" (expected one of: ") in err, err
    assert "name the variable in password_env)" in err and "hunter2" not in err, err


@pytest.mark.parametrize("value,says", [
    ("0", "client_ipv6_prefix: 0 is out of range [1, 128]"),
    ("129", "client_ipv6_prefix: 129 is out of range [1, 128]"),
    ('"64"', 'client_ipv6_prefix: expected an integer, got the string "64" (remove the quotes)'),
    ("064", 'client_ipv6_prefix: "064" has a leading zero'),
    ("/64", 'client_ipv6_prefix: expected an integer, got "/64"'),
])
def test_client_ipv6_prefix_errors(tmp_path, value, says):
    path = write(tmp_path, variant(insert={9: ["client_ipv6_prefix: " + value]}))
    errs = run_bad(path)
    assert [(l, c) for l, c, _ in errs] == [(9, 21)], errs
    assert says in errs[0][2], errs


def test_client_ipv6_prefix_overrides_in_one_network_are_one_client(tmp_path):
    """Two addresses of one /64 are one client's key: listed in two
    overrides, only the first would apply, which the error says. The
    prefix is read ahead of the routes, wherever it is in the file."""
    lines = with_overrides('{ keys: ["2001:db8::1"], unlimited: true }',
                           '{ keys: ["2001:db8::2"], unlimited: true }')
    run_good(write(tmp_path, lines))                # two clients without the prefix
    path = write(tmp_path, lines + ["client_ipv6_prefix: 64"])
    errs = run_bad(path)
    # each key's own warning (it names its whole /64) comes after the error
    assert [e[:2] for e in errs if e[2].startswith("warning: ")] == [(17, 18), (18, 18)]
    errs = [e for e in errs if not e[2].startswith("warning: ")]
    assert errs == [(18, 18, 'overrides: client key "2001:db8::2" is already listed at '
                     '17:18 (the same client: client_ipv6_prefix counts the addresses '
                     'of a network as one); only its first override would apply')], errs


def test_client_ipv6_prefix_under_32_is_warned(tmp_path):
    path = write(tmp_path, variant(insert={9: ["client_ipv6_prefix: 16"]}))
    p = validate(path)
    assert p.returncode == 0, p.stderr.decode()
    assert ("%s:9:21: warning: client_ipv6_prefix: 16 counts every address under one /16 "
            "as one client" % path) in p.stderr.decode()


def test_client_ipv6_prefix_override_warnings_say_what_a_key_names(tmp_path):
    """Under a prefix, an override key with bits past it (written bare or
    with "/64") is warned as its whole network; a range of another length
    gets advice in the prefix's terms; one address spelled twice is "the
    same address" (a review found the first silent and the other two
    worded for no prefix)."""
    lines = with_overrides('{ keys: ["2001:db8:7::1/64", "2001:db8:8::/64", '
                           '"2001:db8:6::/48"], unlimited: true }')
    path = write(tmp_path, lines + ["client_ipv6_prefix: 64"])
    err = run_good(path)
    assert ('%s:17:18: warning: overrides: "2001:db8:7::1/64" applies to every address '
            'of 2001:db8:7::/64 (client_ipv6_prefix: 64 counts them as one client)'
            % path) in err, err
    assert "2001:db8:8::/64" not in err, err
    assert ('%s:17:57: warning: overrides: "2001:db8:6::/48" is a range, and a key is '
            'one client: here an IPv6 client is a /64 network (client_ipv6_prefix), '
            'written as its address and /64: list those' % path) in err, err
    # "::/64" names the clients of ::/64 outside ::/96, and spaces around
    # an address are no header value's (a review found both warned as
    # naming no client); fe80::/64 does name none: its hosts are whole
    lines = with_overrides('{ keys: ["::ffff:1.2.3.4/64", " 2001:db8:2::/64 ", '
                           '"fe80::/64"], unlimited: true }')
    path = write(tmp_path, lines + ["client_ipv6_prefix: 64"])
    err = run_good(path)
    assert err.splitlines() == [
        '%s:17:18: warning: overrides: "::ffff:1.2.3.4/64" applies to every address of '
        '::/64 (client_ipv6_prefix: 64 counts them as one client)' % path,
        '%s:17:60: warning: overrides: "fe80::/64" is a range, and a key is one client: '
        'each of its addresses is a client whole (an IPv4 host written in IPv6, ::1, a '
        'link-local address): list them' % path], err
    lines = with_overrides('{ keys: ["2001:db8::1"], unlimited: true }',
                           '{ keys: ["2001:DB8::1"], unlimited: true }')
    errs = run_bad(write(tmp_path, lines + ["client_ipv6_prefix: 64"]))
    errs = [e for e in errs if not e[2].startswith("warning: ")]
    assert errs == [(18, 18, 'overrides: client key "2001:DB8::1" is already listed at '
                     '17:18 (the same address); only its first override would apply')], errs
