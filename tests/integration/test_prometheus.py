"""conf/prometheus-alerts.yaml against a real Prometheus scraping the real
daemon: the rules' expressions match the exposition as it is, labels and
all, and each alert fires on the fault it names and resolves when it ends.
Only the rules' `for:` waits are cut to a second; every expression is the
shipped one. (tests/prometheus/alerts_test.yaml checks thresholds and
wording with promtool on made-up series.)

Prometheus comes from Debian's package, unpacked under build/prometheus by
scripts/fetch-prometheus.sh (`make test` runs it); without it these tests
are skipped."""
import os
import re
import shutil
import signal
import subprocess
import time

import pytest
import requests

from conftest import free_port, terminate_process, wait_until
from ops_helpers import ops_daemon, policy, route, terminate, wait_exit  # noqa: F401

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
RULES = os.path.join(ROOT, "conf", "prometheus-alerts.yaml")
PROM_DIR = os.path.join(ROOT, "build", "prometheus", "usr", "bin")
PROMETHEUS = (os.path.join(PROM_DIR, "prometheus")
              if os.access(os.path.join(PROM_DIR, "prometheus"), os.X_OK)
              else shutil.which("prometheus"))
PROMTOOL = (os.path.join(PROM_DIR, "promtool")
            if os.access(os.path.join(PROM_DIR, "promtool"), os.X_OK)
            else shutil.which("promtool"))

pytestmark = pytest.mark.skipif(
    PROMETHEUS is None or PROMTOOL is None,
    reason="no prometheus: run sh scripts/fetch-prometheus.sh")

LIMIT = "{algorithm: fixed_window, limit: 1000000, window: 1h}"
POLICY = policy(route("api", "/api/", LIMIT) +
                route("login", "/login/", LIMIT, extra="    failure_mode: closed\n") +
                route("trial", "/trial/", LIMIT,
                      extra="    failure_mode: closed\n    shadow: true\n"))


def test_shipped_rules_pass_promtool():
    out = subprocess.run([PROMTOOL, "check", "rules", RULES], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS: 8 rules found" in out.stdout, out.stdout
    tests = os.path.join(ROOT, "tests", "prometheus", "alerts_test.yaml")
    out = subprocess.run([PROMTOOL, "test", "rules", tests], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


class Prometheus:
    def __init__(self, tmp_path, target):
        self.port = free_port()
        self.dir = str(tmp_path / "prometheus")
        os.makedirs(self.dir)
        with open(RULES) as f:
            rules = re.sub(r"(?m)^(\s+for:) \S+$", r"\1 1s", f.read())
        with open(os.path.join(self.dir, "alerts.yaml"), "w") as f:
            f.write(rules)
        with open(os.path.join(self.dir, "prometheus.yml"), "w") as f:
            f.write("global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
                    "rule_files: [alerts.yaml]\n"
                    "scrape_configs:\n"
                    "  - job_name: ratelimitd\n"
                    "    scrape_timeout: 900ms\n"
                    "    static_configs: [{targets: ['%s']}]\n" % target)
        self.log = open(os.path.join(self.dir, "log"), "w")
        self.proc = subprocess.Popen(
            [PROMETHEUS, "--config.file=" + os.path.join(self.dir, "prometheus.yml"),
             "--storage.tsdb.path=" + os.path.join(self.dir, "data"),
             "--web.listen-address=127.0.0.1:%d" % self.port],
            stdout=self.log, stderr=subprocess.STDOUT, cwd=self.dir)
        assert wait_until(self.ready, timeout=30), self.read_log()

    def ready(self):
        try:
            return requests.get(self.url("/-/ready"), timeout=1).status_code == 200
        except requests.RequestException:
            return False

    def url(self, path):
        return "http://127.0.0.1:%d%s" % (self.port, path)

    def query(self, expr):
        r = requests.get(self.url("/api/v1/query"), params={"query": expr}, timeout=5)
        assert r.status_code == 200, r.text
        return r.json()["data"]["result"]

    def firing(self):
        """{(alertname, route or None)} of the alerts firing now."""
        r = requests.get(self.url("/api/v1/alerts"), timeout=5)
        assert r.status_code == 200, r.text
        return {(a["labels"]["alertname"], a["labels"].get("route"))
                for a in r.json()["data"]["alerts"] if a["state"] == "firing"}

    def read_log(self):
        with open(os.path.join(self.dir, "log")) as f:
            return f.read()[-4000:]

    def stop(self):
        terminate_process(self.proc)
        self.log.close()


@pytest.fixture
def prometheus(tmp_path):
    started = []

    def start(target):
        p = Prometheus(tmp_path, target)
        started.append(p)
        return p
    yield start
    for p in started:
        p.stop()


def checks(d, n, path):
    for i in range(n):
        requests.get(d.url(path), headers={"X-Key": "k%d" % i}, timeout=2)


def wait_firing(prom, want, d, timeout=30):
    """Keeps traffic going (a rate needs checks) until every alert in
    `want` fires; returns what fired."""
    deadline = time.monotonic() + timeout
    got = set()
    while time.monotonic() < deadline:
        checks(d, 20, "/check/api/x")
        checks(d, 20, "/check/login/x")
        checks(d, 20, "/check/trial/x")
        got = prom.firing()
        if want <= got:
            return got
        time.sleep(0.5)
    raise AssertionError("firing %r, wanted %r\n%s" % (got, want, prom.read_log()))


def test_alerts_fire_on_the_daemons_own_metrics(ops_daemon, prometheus, redis_server):
    d = ops_daemon(POLICY)
    prom = prometheus("127.0.0.1:%d" % d.port)
    # Healthy: scraped, checks counted, nothing firing.
    assert wait_until(lambda: prom.query('up{job="ratelimitd"} == 1'), timeout=15), \
        prom.read_log()
    checks(d, 50, "/check/api/x")
    assert wait_until(lambda: prom.query(
        'ratelimitd_checks_total{route="api",result="allowed"} >= 50'), timeout=10)
    time.sleep(3)                       # a few evaluations with all well
    assert prom.firing() == set()

    # A gateway sends requests the daemon refuses (paths it does not serve).
    deadline = time.monotonic() + 30
    while ("RatelimitdRequestsRefused", None) not in prom.firing():
        assert time.monotonic() < deadline, (prom.firing(), prom.read_log())
        for _ in range(5):
            assert requests.get(d.url("/nope"), timeout=2).status_code == 404
        checks(d, 20, "/check/api/x")
        time.sleep(0.5)
    assert prom.query('ratelimitd_http_errors_total{status="404"} > 0')

    # Redis answers errors: OOM under maxmemory with noeviction.
    r = redis_server.client()
    r.config_set("maxmemory-policy", "noeviction")
    r.config_set("maxmemory", 1)
    got = wait_firing(prom, {("RatelimitdRedisErrors", None),
                             ("RatelimitdFailingOpen", "api"),
                             ("RatelimitdFailingClosed", "login")}, d)
    assert ("RatelimitdRedisDown", None) not in got   # connected, answering
    r.config_set("maxmemory", 0)

    # Redis gone.
    redis_server.kill()
    got = wait_firing(prom, {("RatelimitdRedisDown", None),
                             ("RatelimitdFailingOpen", "api"),
                             ("RatelimitdFailingClosed", "login")}, d)
    # The shadow route counts failed_closed too, but let every check through.
    assert prom.query('ratelimitd_checks_total{route="trial",result="failed_closed"} > 0')
    assert ("RatelimitdFailingClosed", "trial") not in got, got

    # A policy file the daemon refuses, until it is put right.
    with open(d.policy_path) as f:
        good = f.read()
    with open(d.policy_path, "w") as f:
        f.write(good.replace("limit: 1000000", "limit: -1"))
    d.signal(signal.SIGHUP)
    assert wait_until(lambda: ("RatelimitdPolicyReloadFailed", None) in prom.firing(),
                      timeout=15), (prom.firing(), d.log())
    with open(d.policy_path, "w") as f:
        f.write(good + "\n")
    d.signal(signal.SIGHUP)
    assert wait_until(lambda: ("RatelimitdPolicyReloadFailed", None) not in prom.firing(),
                      timeout=15), (prom.firing(), d.log())

    # The daemon gone: its scrape fails.
    terminate(d)
    assert wait_exit(d, 10) == 0
    assert wait_until(lambda: ("RatelimitdDown", None) in prom.firing(), timeout=15), \
        prom.firing()
