"""The policies shipped in conf/ are valid as shipped (a new user starts
from them), and the nginx pairing keeps the one setting nginx needs."""
import os
import subprocess

from conftest import BIN, ROOT


def validate(name):
    path = os.path.join(ROOT, "conf", name)
    return subprocess.run([BIN, "-t", "-c", path], capture_output=True, text=True, timeout=10), path


def test_example_policy_validates():
    r, path = validate("ratelimitd.yaml")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == path + ": ok"


def test_nginx_policy_validates_and_denies_with_403():
    r, path = validate("nginx-policy.yaml")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == path + ": ok"
    with open(path) as f:
        assert "deny_status: 403" in f.read()


def _run(path):
    return subprocess.run([BIN, "-t", "-c", path], capture_output=True, text=True, timeout=10)


def _routes(n, match="    match: { prefix: / }\n"):
    return "routes:\n" + "".join(
        "  - name: r%d\n%s    limits: [{ algorithm: fixed_window, limit: 1, window: 1s }]\n"
        % (i, match) for i in range(n))


def test_route_cap_is_documented_and_enforced(tmp_path):
    """The loader refuses more than 1000 routes; the example policy and the
    README's policy reference say so."""
    good, bad = tmp_path / "1000.yaml", tmp_path / "1001.yaml"
    good.write_text(_routes(1000))
    bad.write_text(_routes(1001))
    assert _run(str(good)).returncode == 0
    r = _run(str(bad))
    assert r.returncode == 1 and "routes: at most 1000 routes" in r.stderr
    with open(os.path.join(ROOT, "conf", "ratelimitd.yaml")) as f:
        assert "at most 1000 routes" in f.read().lower()
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    row = [l for l in readme.splitlines() if l.startswith("| `routes` |")]
    assert row and "at most 1000" in row[0], row


def test_match_is_optional_as_documented(tmp_path):
    """A route without `match` matches every path: the example policy must
    not call it required."""
    p = tmp_path / "nomatch.yaml"
    p.write_text(_routes(1, match=""))
    assert _run(str(p)).returncode == 0
    with open(os.path.join(ROOT, "conf", "ratelimitd.yaml")) as f:
        text = f.read()
    line = [l for l in text.splitlines() if l.startswith("#   match ")]
    assert line and "required" not in line[0] and "optional" in line[0], line
