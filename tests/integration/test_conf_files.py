"""The policies shipped in conf/ are valid as shipped (a new user starts
from them), and the nginx pairing keeps the one setting nginx needs."""
import json
import os
import shutil
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


def test_readme_validation_example_is_what_the_binary_prints():
    """The README's `-t` example, run from the repository root on the file
    it names, prints exactly the lines the README shows."""
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    block = readme[readme.index("$ build/ratelimitd -t -c conf/examples/bad.yaml\n"):]
    shown = block[block.index("\n") + 1:block.index("```")]
    r = subprocess.run([BIN, "-t", "-c", "conf/examples/bad.yaml"], cwd=ROOT,
                       capture_output=True, text=True, timeout=10)
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr == shown, (r.stderr, shown)


def test_make_run_survives_its_redis_going_first(tmp_path):
    """scripts/run.sh stops the redis-server it started; one that is gone
    already (stopped by hand) must not turn a clean exit into exit 1."""
    import signal
    import socket
    import time
    from conftest import free_port, wait_until
    port, rport = free_port(), free_port()
    pol = tmp_path / "p.yaml"
    pol.write_text("server:\n  listen: 127.0.0.1:%d\nredis:\n  address: 127.0.0.1:%d\n"
                   "routes: []\n" % (port, rport))
    p = subprocess.Popen(["sh", "scripts/run.sh", str(pol)], cwd=ROOT, start_new_session=True,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    redis_pid = None
    try:
        def up():
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        assert wait_until(up, timeout=10)
        # Redis says its own PID (pgrep is procps, not in a minimal image)
        import redis
        redis_pid = int(redis.Redis(port=rport).info("server")["process_id"])
        os.kill(redis_pid, signal.SIGKILL)
        time.sleep(0.2)
        os.killpg(p.pid, signal.SIGINT)
        assert p.wait(15) == 0, p.stdout.read().decode()
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)    # its trap stops its Redis
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        if redis_pid is not None:   # in its own session: not in p's group
            try:
                os.kill(redis_pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


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
    assert r.returncode == 1 and "routes[1000]: one too many: at most 1000 routes" in r.stderr
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


def test_compose_policy_validates_and_is_mounted_from_its_file():
    """conf/compose.yaml's policy is a file it mounts: an inline `content:`
    config cannot be created in a read_only service."""
    r, path = validate("compose-policy.yaml")
    assert r.returncode == 0, r.stderr
    with open(os.path.join(ROOT, "conf", "compose.yaml")) as f:
        compose = f.read()
    assert "file: ./compose-policy.yaml" in compose and "content:" not in compose.replace(
        "`content:`", "")


def test_make_install_puts_what_the_unit_runs_where_it_looks(tmp_path):
    """The unit ran /usr/local/bin/ratelimitd on /etc/ratelimitd's policy,
    and nothing put them there (an audit): `make install` does, with the
    unit rewritten to the directories given, and keeps a policy already
    installed."""
    prefix = tmp_path / "opt"
    conf = tmp_path / "etc" / "ratelimitd" / "ratelimitd.yaml"
    unit = tmp_path / "unit" / "ratelimitd.service"

    def install():
        r = subprocess.run(["make", "-s", "install", "PREFIX=%s" % prefix,
                            "SYSCONFDIR=%s" % (tmp_path / "etc"),
                            "UNITDIR=%s" % unit.parent],
                           cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        return r.stdout

    install()
    binary = prefix / "bin" / "ratelimitd"
    assert os.access(binary, os.X_OK)
    r = subprocess.run([str(binary), "-t", "-c", str(conf)], capture_output=True, text=True,
                       timeout=10)
    assert r.returncode == 0 and r.stdout == "%s: ok\n" % conf, r.stdout + r.stderr
    text = unit.read_text()
    execs = [l for l in text.splitlines() if l.startswith(("ExecStart", "ExecReload"))]
    assert execs == ["ExecStartPre=%s -t -c %s" % (binary, conf),
                     "ExecStart=%s -c %s" % (binary, conf),
                     "ExecReload=%s -t -c %s" % (binary, conf),
                     "ExecReload=/bin/kill -HUP $MAINPID"], execs
    assert "EnvironmentFile=-%s" % (tmp_path / "etc" / "default" / "ratelimitd") in text
    assert oct(unit.stat().st_mode & 0o777) == "0o644"
    if shutil.which("systemd-analyze"):
        # every command the unit names exists and the unit parses
        r = subprocess.run(["systemd-analyze", "verify", "--man=no", str(unit)],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
    # the operator's edit survives a second install
    conf.write_text(conf.read_text() + "# edited\n")
    assert "kept as it is" in install()
    assert conf.read_text().endswith("# edited\n")
    r = subprocess.run(["make", "-s", "uninstall", "PREFIX=%s" % prefix,
                        "UNITDIR=%s" % unit.parent], cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and not binary.exists() and not unit.exists(), r.stderr
    assert conf.exists()


def dockerfile_healthcheck():
    """The HEALTHCHECK's CMD, as Docker would exec it."""
    with open(os.path.join(ROOT, "Dockerfile")) as f:
        text = f.read()
    at = text.index("\nHEALTHCHECK ")
    cmd = text[text.index("CMD [", at) + 4:]
    return json.loads(cmd[:cmd.index("]\n") + 1])


def test_the_dockerfile_healthcheck_asks_the_daemon(start_daemon):
    """No Docker engine runs here, so the image's HEALTHCHECK is run as
    Docker runs it: healthy while the daemon serves on the port it is told,
    unhealthy when nothing answers there."""
    from helpers import policy
    d = start_daemon(policy("  - name: r\n    match: {prefix: /}\n    limits: [{algorithm: "
                            "fixed_window, limit: 5, window: 1m}]\n"))
    cmd = dockerfile_healthcheck()
    assert cmd[0] == "bash"
    env = dict(os.environ, RATELIMITD_HEALTH_PORT=str(d.port))
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=10)
    assert r.returncode == 0, r.stderr
    assert d.stop() == 0
    d.proc = None       # stopped here, not at teardown
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=10)
    assert r.returncode != 0


def test_shipped_policies_exempt_nobody():
    """`make install` puts conf/ratelimitd.yaml in /etc/ratelimitd: its
    `internal-monitor` exemption was in force, a bypass key anyone who read
    the README could send (an audit). The shipped policies keep their
    exemptions commented out."""
    for name in sorted(os.listdir(os.path.join(ROOT, "conf"))):
        if not name.endswith(".yaml") or "policy" not in name and name != "ratelimitd.yaml":
            continue
        with open(os.path.join(ROOT, "conf", name)) as f:
            live = [l for l in f if "unlimited: true" in l.split("#", 1)[0]]
        assert live == [], (name, live)
