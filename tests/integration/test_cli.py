"""The command line (SPEC §2): -c/-t/-v/-h and the long forms people type
by habit (--config, --test, --version, --help); a wrong option is a usage
error on stderr with exit status 1."""
import os
import socket
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


def test_version_and_help_together_print_both():
    """`-vh` printed the help alone; nginx -v -h prints its version above
    its help."""
    for args in (("-vh",), ("-v", "-h"), ("--help", "--version")):
        r = run(*args)
        assert r.returncode == 0, (args, r.stderr)
        first, second = r.stdout.splitlines()[:2]
        assert first.startswith("ratelimitd ") and second.startswith("usage: "), r.stdout


def test_version_short_and_long():
    outs = {run(flag).stdout for flag in ("-v", "--version")}
    assert len(outs) == 1
    out = outs.pop()
    assert out.startswith("ratelimitd ") and out.strip() != "ratelimitd", out


def test_version_and_help_do_not_hide_a_wrong_option():
    """`--version --bogus` printed the version and exited 0 (an audit): the
    whole line is read first, as GNU tools and nginx do."""
    for args, says in ((("--version", "--bogus"), 'unknown option "--bogus"'),
                       (("-v", "extra"), 'unexpected argument "extra"'),
                       (("-h", "-x"), "unknown option -x")):
        r = run(*args)
        assert r.returncode == 1 and says in r.stderr and r.stdout == "", (args, r)
    # with -t, as nginx -v -t: the version, then the check of the file
    r = run("-v", "-t", "-c", POLICY)
    assert r.returncode == 0 and r.stdout.splitlines()[1] == POLICY + ": ok", r
    r = run("-t", "-v", "-c", "/nonexistent.yaml")
    assert r.returncode == 1 and r.stdout.startswith("ratelimitd "), r
    assert "/nonexistent.yaml:1:1: cannot open" in r.stderr, r
    # alone, or with -c and no -t: the version, and nothing is started
    r = run("-v", "-c", POLICY)
    assert r.returncode == 0 and r.stdout.startswith("ratelimitd "), r


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
                       (("-t", "-c", ""), "-c needs a file name, not an empty one"),
                       # named "ratelimitd" as above, not after the path the
                       # binary was run by, as getopt's own messages were
                       (("-x",), "unknown option -x"),
                       (("-tx",), "unknown option -x"),
                       (("--bogus",), 'unknown option "--bogus"'),
                       (("--test=1",), '"--test=1": that option takes no value'),
                       (("-c",), "-c needs a file name"),
                       (("--config",), "--config needs a file name")):
        r = run(*args)
        assert r.returncode == 1 and r.stderr.startswith("ratelimitd: " + says), (args, r.stderr)


def test_started_with_standard_streams_closed(tmp_path, redis_server):
    """With fds 0-2 closed, libevent's signal pipe took fd 2 and every log
    line was read back as signals: a byte 15 in a logged path (the reload
    line says it) stopped the daemon as a SIGTERM would, and a newline
    reads as SIGUSR1. Each closed one is held by /dev/null now."""
    import signal
    import time

    import requests

    from conftest import free_port, wait_until
    port = free_port()
    path = os.path.join(str(tmp_path), "p\x0fx\x01.yaml")
    with open(path, "w") as f:
        f.write("server: {listen: 127.0.0.1:%d}\nredis: {address: 127.0.0.1:%d}\n"
                "routes: []\n" % (port, redis_server.port))
    proc = subprocess.Popen(["/bin/sh", "-c", 'exec "$0" -c "$1" <&- >&- 2>&-', BIN, path],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        url = "http://127.0.0.1:%d/healthz" % port
        assert wait_until(lambda: requests.get(url, timeout=1).ok, timeout=10)
        for _ in range(3):
            proc.send_signal(signal.SIGHUP)
            time.sleep(0.3)
        assert proc.poll() is None, proc.returncode
        assert requests.get(url, timeout=2).ok
        assert sorted(os.readlink("/proc/%d/fd/%d" % (proc.pid, fd)) for fd in (0, 1, 2)) \
            == ["/dev/null"] * 3
    finally:
        proc.terminate()
        assert proc.wait(10) == 0


def test_starting_on_a_bad_policy_says_what_t_says_and_exits_1(tmp_path):
    """`ratelimitd -c FILE` on a file -t refuses: the same FILE:LINE:COL
    lines on stderr and exit 1, before anything is started (a container's
    first start shows this in its log)."""
    path = str(tmp_path / "bad.yaml")
    with open(path, "w") as f:
        f.write("routes:\n"
                "  - name: a\n"
                "    match: {prefix: /}\n"
                "    key: ip\n"
                "    limits: [{algorithm: fixed_window, limit: 0, window: 1s}]\n"
                "  - key: ip\n")
    checked = run("-t", "-c", path)
    started = run("-c", path)
    assert checked.returncode == 1 and started.returncode == 1, (checked, started)
    assert started.stderr == checked.stderr, (started.stderr, checked.stderr)
    lines = started.stderr.splitlines()
    assert lines[0].startswith(path + ":5:") and "limit: 0" in lines[0], lines
    assert lines[1:] == [path + ':6:5: route: "name" is required',
                         path + ':6:5: route: "limits" is required'], lines
    assert started.stdout == "", started.stdout


def test_a_listen_address_in_use_is_named_and_exits_1(tmp_path):
    """Another process on server.listen's port (an old daemon, a second
    container in the pod): one line naming the address and the reason, exit
    1, as nginx's "bind() to ... failed (98: Address already in use)"."""
    taken = socket.socket()
    try:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        path = str(tmp_path / "busy.yaml")
        with open(path, "w") as f:
            f.write('server: {listen: "127.0.0.1:%d"}\n'
                    "routes: [{name: a, match: {prefix: /}, key: ip,\n"
                    "          limits: [{algorithm: fixed_window, limit: 1, window: 1s}]}]\n"
                    % port)
        r = run("-c", path)
    finally:
        taken.close()
    assert r.returncode == 1, r
    assert r.stderr.endswith(" fatal bind 127.0.0.1:%d: Address already in use\n" % port), r
    assert r.stderr.count("\n") == 1 and r.stdout == "", r
