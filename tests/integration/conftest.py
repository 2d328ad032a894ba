"""Shared harness for the integration suite: real redis-server, real daemon.

Every test gets its own redis-server on a free port and starts the daemon
with a policy written to a tmpdir. Nothing here mocks anything: these are
the processes a user runs. RATELIMITD_BIN picks the binary (the ASan run
points it at build/asan/ratelimitd).
"""
import os
import signal
import socket
import subprocess
import time

import pytest
import redis
import requests

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.environ.get("RATELIMITD_BIN", os.path.join(ROOT, "build", "ratelimitd"))
SCRIPT = os.path.join(ROOT, "build", "limits.lua")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(pred, timeout=5.0, interval=0.02):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            if pred():
                return True
        except Exception:
            pass
        time.sleep(interval)
    return False


def terminate_process(proc, timeout=10):
    """SIGTERM a helper process (Prometheus, stunnel) and reap it; SIGKILL
    if it has not exited within `timeout`."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def all_stopped(pid):
    """Every thread of `pid` has stopped. kill(SIGSTOP) returns before the
    threads do: each stops itself once it is scheduled, and until then a
    thread that is running, or woken by a request, may still serve it."""
    states = []
    for tid in os.listdir("/proc/%d/task" % pid):
        with open("/proc/%d/task/%s/stat" % (pid, tid)) as f:
            states.append(f.read().rsplit(")", 1)[1].split()[0])
    return all(st in ("T", "t") for st in states)


def open_files(pid):
    """What the process's descriptors point at (readlink of /proc/PID/fd):
    paths, "socket:[N]", "pipe:[N]". A process gone raises, so that no
    count reads as zero; a descriptor closed between the listing and the
    look is not open."""
    fds = "/proc/%d/fd" % pid
    targets = []
    for name in os.listdir(fds):
        try:
            targets.append(os.readlink(os.path.join(fds, name)))
        except OSError:
            pass
    return targets


def read_log(path):
    """A process's log file as text ("" before it exists)."""
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


class RedisServer:
    def __init__(self, tmpdir, port=None):
        self.dir = str(tmpdir)
        self.port = port or free_port()
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--dir", self.dir,
             "--logfile", os.path.join(self.dir, "redis-%d.log" % self.port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        assert wait_until(lambda: self.client().ping(), interval=0.005), "redis did not start"
        return self

    def client(self):
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=2)

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def pause(self):
        os.kill(self.proc.pid, signal.SIGSTOP)
        assert wait_until(lambda: all_stopped(self.proc.pid)), "redis did not stop"

    def resume(self):
        os.kill(self.proc.pid, signal.SIGCONT)

    def stop(self):
        """Gone, as a crash or a stopped container leaves it: its clients
        see their connections closed either way. SIGKILL rather than
        SIGTERM: Redis acts on SIGTERM only at its next cron tick (up to
        100 ms), which cost every test about 80 ms."""
        self.kill()


class Daemon:
    """The real ratelimitd. `policy` is YAML text with {port} and {redis_port}
    placeholders (use {{ }} for literal braces)."""

    def __init__(self, tmpdir, redis_port, policy, port=None, env=None, args=(), bin=None):
        self.bin = bin or BIN
        self.dir = str(tmpdir)
        self.port = port or free_port()
        self.redis_port = redis_port
        self.policy_path = os.path.join(self.dir, "policy-%d.yaml" % self.port)
        self.log_path = os.path.join(self.dir, "daemon-%d.log" % self.port)
        self.env = dict(os.environ, **(env or {}))
        self.args = list(args)
        self.write_policy(policy)
        self.proc = None

    def write_policy(self, policy):
        text = policy.format(port=self.port, redis_port=self.redis_port)
        tmp = self.policy_path + ".tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.rename(tmp, self.policy_path)

    def start(self, wait_ready=True):
        self.logf = open(self.log_path, "ab")
        self.proc = subprocess.Popen([self.bin, "-c", self.policy_path] + self.args,
                                     stdout=self.logf, stderr=self.logf, env=self.env)
        assert wait_until(lambda: requests.get(self.url("/healthz"), timeout=1).ok,
                          timeout=10, interval=0.005), "daemon did not start:\n" + self.log()
        if wait_ready:
            assert wait_until(lambda: requests.get(self.url("/readyz"), timeout=1).ok,
                              timeout=10, interval=0.005), "daemon not ready:\n" + self.log()
        return self

    def url(self, path):
        return "http://127.0.0.1:%d%s" % (self.port, path)

    def log(self):
        return read_log(self.log_path)

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig):
        os.kill(self.proc.pid, sig)

    def stop(self, timeout=10):
        """SIGTERM and wait; returns the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError("daemon did not stop on SIGTERM:\n" + self.log())
        self.logf.close()
        return self.proc.returncode


@pytest.fixture(autouse=True)
def avoid_hour_boundary():
    """Most tests count in an aligned 1h fixed window:
    one that straddled the top of the hour would see its counts reset.
    Start clear of it, by more than most tests take: the wait comes at
    most once an hour of testing."""
    left = 3600 - time.time() % 3600
    if left < 15:
        time.sleep(left + 0.05)
    yield


@pytest.fixture
def redis_server(tmp_path):
    server = RedisServer(tmp_path).start()
    yield server
    server.stop()


@pytest.fixture
def start_daemon(tmp_path, redis_server):
    """Factory: start_daemon(policy_yaml, **kw) -> Daemon, stopped at teardown.
    At teardown every daemon must still be alive and exit 0 on SIGTERM."""
    daemons = []

    def start(policy, wait_ready=True, **kw):
        d = Daemon(tmp_path, kw.pop("redis_port", redis_server.port), policy, **kw)
        daemons.append(d)
        return d.start(wait_ready=wait_ready)

    yield start
    for d in daemons:
        if d.proc is not None:
            assert d.alive(), "daemon died:\n" + d.log()
            assert d.stop() == 0, "daemon exit code not 0:\n" + d.log()
