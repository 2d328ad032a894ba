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
