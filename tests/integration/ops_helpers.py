"""Helpers for the operations integration tests (issue 4): reloads, metrics,
drain, policy features and logs.

Policies are plain YAML with the placeholders @PORT@ and @REDIS_PORT@;
`policy()` escapes braces for conftest.Daemon, which runs str.format on the
text. The `ops_daemon` fixture is like conftest's `start_daemon`, but lets a
test pick the policy path (a ConfigMap symlink) and stop the daemon itself
(drain tests) without the teardown calling that a crash.
"""
import json
import re
import signal
import subprocess
import time

import pytest
import requests

from conftest import Daemon, wait_until


def fmt(text):
    """Escape braces for str.format; @PORT@/@REDIS_PORT@ -> placeholders."""
    return (text.replace("{", "{{").replace("}", "}}")
            .replace("@PORT@", "{port}").replace("@REDIS_PORT@", "{redis_port}"))


def policy(routes, server="", redis="", top="", timeout="50ms"):
    """A whole policy: `routes` is the YAML under `routes:` (indented two
    spaces); `server`/`redis` extra lines for those sections (indented two
    spaces); `top` extra top-level lines."""
    return fmt("server:\n"
               "  listen: 127.0.0.1:@PORT@\n" + server +
               "redis:\n"
               "  address: 127.0.0.1:@REDIS_PORT@\n"
               "  timeout: " + timeout + "\n" + redis + top +
               "routes:\n" + routes)


def render(d, text):
    """A policy() text as the daemon `d` would have it on disk."""
    return text.format(port=d.port, redis_port=d.redis_port)


def fw(limit, name="q", window="1h"):
    return "{name: %s, algorithm: fixed_window, limit: %d, window: %s}" % (
        name, limit, window)


def route(name, prefix, limits, key="header:X-Key", extra=""):
    """One route entry; `limits` is a YAML flow list body (without [])."""
    return ("  - name: %s\n    match: {prefix: %s}\n    key: %s\n%s"
            "    limits: [%s]\n" % (name, prefix, key, extra, limits))


# ------------------------------------------------------------ daemon control

@pytest.fixture
def ops_daemon(tmp_path, redis_server):
    """Factory: ops_daemon(policy, path=None, **kw) -> Daemon. `path` runs
    the daemon on that policy file instead of the one Daemon writes. At
    teardown a daemon the test did not stop itself (see `terminate`) must
    still be alive and exit 0 on SIGTERM."""
    daemons = []

    def start(text, path=None, wait_ready=True, **kw):
        d = Daemon(kw.pop("tmpdir", tmp_path), kw.pop("redis_port", redis_server.port),
                   text, **kw)
        d.stopped_by_test = False
        if path is not None:
            d.policy_path = path
        daemons.append(d)
        return d.start(wait_ready=wait_ready)

    yield start
    failures = []
    for d in daemons:
        if d.proc is None:
            continue
        if d.stopped_by_test:
            if d.proc.poll() is None:
                d.proc.kill()
                d.proc.wait()
            d.logf.close()
            continue
        if not d.alive():
            failures.append("daemon died:\n" + d.log())
            d.logf.close()
            continue
        code = d.stop()
        if code != 0:
            failures.append("daemon exit code %r:\n%s" % (code, d.log()))
    assert not failures, "\n".join(failures)


def terminate(d, sig=signal.SIGTERM):
    """Send a stop signal; the test now owns the exit. Returns the time sent."""
    d.stopped_by_test = True
    t0 = time.monotonic()
    d.signal(sig)
    return t0


def wait_exit(d, timeout):
    """Wait for the daemon to exit; returns its exit code or None."""
    try:
        return d.proc.wait(timeout)
    except subprocess.TimeoutExpired:
        return None


# ------------------------------------------------------------------- HTTP

def check(d, path="/check", method="GET", headers=None, timeout=5, **kw):
    return requests.request(method, d.url(path), headers=headers or {},
                            timeout=timeout, allow_redirects=False, **kw)


def vcheck(d, body, timeout=5):
    return requests.post(d.url("/v1/check"), data=json.dumps(body), timeout=timeout,
                         headers={"Content-Type": "application/json"})


def get_policy(d):
    r = requests.get(d.url("/v1/policy"), timeout=2)
    assert r.status_code == 200, r.text
    return r.json()


def route_limits(d, route_name):
    """The limits of one route in /v1/policy, or None."""
    for r in get_policy(d)["routes"]:
        if r["name"] == route_name:
            return r["limits"]
    return None


def wait_policy_limit(d, route_name, quota, timeout=2.0, field="limit"):
    """Poll /v1/policy until route's first limit has `field` == quota."""
    def ok():
        ls = route_limits(d, route_name)
        return ls is not None and ls[0].get(field) == quota
    return wait_until(ok, timeout=timeout, interval=0.02)


# ---------------------------------------------------------------- metrics

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?[ \t]+(\S+)(?:[ \t]+-?\d+)?$')
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*(,|$)')


def parse_labels(s):
    labels, pos = {}, 0
    s = s or ""
    while pos < len(s):
        m = _LABEL.match(s, pos)
        if not m:
            raise ValueError("bad label set: %r" % s)
        labels[m.group(1)] = (m.group(2).replace('\\"', '"').replace("\\n", "\n")
                              .replace("\\\\", "\\"))
        pos = m.end()
    return labels


def parse_prometheus(text):
    """Parse the text exposition format strictly enough to catch a broken
    scrape: returns (types, samples) where types maps family -> type and
    samples is a list of (name, labels dict, float value)."""
    types, samples = {}, []
    for line in text.split("\n"):
        if not line.strip():
            continue
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[1] == "TYPE":
                assert len(parts) == 4, line
                assert parts[3] in ("counter", "gauge", "histogram", "summary",
                                    "untyped"), line
                assert parts[2] not in types, "TYPE twice: " + line
                types[parts[2]] = parts[3]
            continue
        m = _SAMPLE.match(line)
        assert m, "not a sample line: %r" % line
        name, labels, value = m.group(1), parse_labels(m.group(2)), m.group(3)
        v = float(value)  # accepts NaN, +Inf
        samples.append((name, labels, v))
    return types, samples


def family_of(name, types):
    if name in types:
        return name
    for suffix in ("_bucket", "_sum", "_count"):
        if name.endswith(suffix) and types.get(name[:-len(suffix)]) in ("histogram", "summary"):
            return name[:-len(suffix)]
    return None


class Metrics:
    def __init__(self, text):
        self.text = text
        self.types, self.samples = parse_prometheus(text)

    def get(self, name, **labels):
        """Value of the one sample with exactly these labels (0 if absent)."""
        found = [v for n, l, v in self.samples if n == name and l == labels]
        assert len(found) <= 1, "duplicate sample %s %r" % (name, labels)
        return found[0] if found else 0.0

    def has(self, name):
        return any(n == name for n, _, _ in self.samples)

    def sum(self, name, **match):
        """Sum of every sample of `name` whose labels include `match`."""
        return sum(v for n, l, v in self.samples
                   if n == name and all(l.get(k) == x for k, x in match.items()))

    def checks(self, route, result):
        return self.get("ratelimitd_checks_total", route=route, result=result)


def scrape(d):
    r = requests.get(d.url("/metrics"), timeout=2)
    assert r.status_code == 200, r.text
    return Metrics(r.text)
