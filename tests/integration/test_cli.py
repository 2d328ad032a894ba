"""The command line (SPEC §2): -c/-t/-v/-h and the long forms people type
by habit (--config, --test, --version, --help); a wrong option is a usage
error on stderr with exit status 1."""
import os
import subprocess

from conftest import BIN, ROOT

POLICY = os.path.join(ROOT, "conf", "ratelimitd.yaml")


def run(*args):
    return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=10)


def test_help_short_and_long():
    for flag in ("-h", "--help"):
        r = run(flag)
        assert r.returncode == 0, (flag, r.stderr)
        assert r.stdout.startswith("usage: ratelimitd -c FILE"), (flag, r.stdout)
        assert "--config" in r.stdout and "--test" in r.stdout


def test_version_short_and_long():
    outs = {run(flag).stdout for flag in ("-v", "--version")}
    assert len(outs) == 1
    out = outs.pop()
    assert out.startswith("ratelimitd ") and out.strip() != "ratelimitd", out


def test_validate_short_and_long():
    for args in (("-t", "-c", POLICY), ("--test", "--config", POLICY),
                 ("--test", "--config=" + POLICY)):
        r = run(*args)
        assert r.returncode == 0, (args, r.stderr)
        assert r.stdout.strip() == POLICY + ": ok"


def test_wrong_usage_exits_1_with_usage_on_stderr():
    for args in (("--bogus",), ("-x",), (), ("-c",), ("-c", POLICY, "extra")):
        r = run(*args)
        assert r.returncode == 1, args
        assert "usage: ratelimitd" in r.stderr, (args, r.stderr)
        assert r.stdout == "", args


def test_wrong_usage_says_what_is_wrong():
    for args, says in ((("-c", POLICY, "extra"), 'unexpected argument "extra"'),
                       (("-t", "-c", POLICY, "--", "-c"), 'unexpected argument "-c"'),
                       ((), "-c FILE is required"),
                       (("-t", "-c", POLICY, "-c", "other.yaml"),
                        f'-c given twice ("{POLICY}" and "other.yaml")'),
                       (("-t", "-c", ""), "-c needs a file name, not an empty one")):
        r = run(*args)
        assert r.returncode == 1 and r.stderr.startswith("ratelimitd: " + says), (args, r.stderr)
