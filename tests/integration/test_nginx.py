"""The nginx recipe, conf/nginx.conf, run for real.

A real nginx, a real ratelimitd and a real upstream (a small Python HTTP
server in a thread that counts what reaches it). The nginx configuration is
conf/nginx.conf itself, with these changes only:

  - addresses: `server 127.0.0.1:8080;` (the daemon), `server 127.0.0.1:9000;`
    (the application) and `listen 8000;` become free ports on 127.0.0.1;
  - paths: temp directories under the test's tmpdir, and `access_log off`;
  - process settings, on the command line: `daemon off; master_process off;`
    (one process, which needs no `user` switch whether the test runs as root
    or not), a pid file in the tmpdir, `error_log stderr`.

Each replaced string must appear in the recipe exactly once, so renaming one
there fails these tests instead of silently testing something else.

The tests are skipped only when there is no `nginx` binary.
"""
import http.client
import json
import os
import shutil
import socket
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from conftest import ROOT, free_port, read_log, wait_until

RECIPE = os.path.join(ROOT, "conf", "nginx.conf")
NGINX = shutil.which("nginx") or next(
    (p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if os.access(p, os.X_OK)),
    None)

pytestmark = pytest.mark.skipif(NGINX is None, reason="no nginx binary")

RL = ("x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset", "retry-after")

# The route most tests use; the fail-closed test's policy has it alone.
API_ROUTE = """\
  - name: api
    match:
      prefix: /api/
    key: ip
    limits:
      - name: w
        algorithm: sliding_window_log
        limit: 3
        window: 1m
"""

# The daemon's policy. deny_status 403 is what the recipe requires. Block
# YAML only, so no braces need escaping for conftest's str.format. Sliding
# logs rather than fixed windows, so that no test can straddle a window
# boundary and see its count reset.
POLICY = """\
server:
  listen: 127.0.0.1:{port}
  deny_status: 403
  ietf_headers: true
redis:
  address: 127.0.0.1:{redis_port}
  timeout: 200ms
routes:
  - name: login
    match:
      path: /auth/login
      methods: [POST]
    key: ip
    limits:
      - name: m
        algorithm: sliding_window_log
        limit: 2
        window: 1m
  - name: hosted
    match:
      prefix: /h/
      host: api.example.com
    key: ip
    limits:
      - name: w
        algorithm: sliding_window_log
        limit: 1
        window: 1m
  - name: keyed
    match:
      prefix: /keyed/
    key: header:X-Api-Key
    missing_key: deny
    limits:
      - name: w
        algorithm: sliding_window_log
        limit: 100
        window: 1m
""" + API_ROUTE


class Upstream:
    """The protected application: 200 "upstream ok" to everything, and a
    record of every request that got through."""

    def __init__(self):
        self.seen = []
        self.lock = threading.Lock()
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def handle_one(self):
                n = int(self.headers.get("Content-Length") or 0)
                if n:
                    self.rfile.read(n)
                with upstream.lock:
                    upstream.seen.append((self.command, self.path))
                body = b"upstream ok"
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = handle_one

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def count(self, prefix):
        with self.lock:
            return sum(1 for _, path in self.seen if path.startswith(prefix))

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def nginx_config(tmpdir, daemon_port, upstream_port, listen_port):
    """conf/nginx.conf with only addresses and paths changed (see the module
    docstring)."""
    with open(RECIPE) as f:
        text = f.read()
    for old, new in (
            ("server 127.0.0.1:8080;", "server 127.0.0.1:%d;" % daemon_port),
            ("server 127.0.0.1:9000;", "server 127.0.0.1:%d;" % upstream_port),
            ("listen 8000;", "listen 127.0.0.1:%d;" % listen_port)):
        assert text.count(old) == 1, "conf/nginx.conf no longer has %r once" % old
        text = text.replace(old, new)

    version = subprocess.run([NGINX, "-V"], capture_output=True, text=True).stderr
    paths = ["access_log off;",
             "client_body_temp_path %s/client_body;" % tmpdir,
             "proxy_temp_path %s/proxy;" % tmpdir]
    for module in ("fastcgi", "uwsgi", "scgi"):
        if "--without-http_%s_module" % module not in version:
            paths.append("%s_temp_path %s/%s;" % (module, tmpdir, module))
    assert text.count("\nhttp {\n") == 1
    text = text.replace("\nhttp {\n", "\nhttp {\n    " + "\n    ".join(paths) + "\n", 1)
    return text


class Nginx:
    def __init__(self, tmpdir, daemon_port, upstream_port, config=None):
        """config(dir, daemon_port, upstream_port, listen_port) -> the
        nginx.conf text; conf/nginx.conf's by default."""
        self.dir = os.path.join(str(tmpdir), "nginx")
        os.makedirs(os.path.join(self.dir, "logs"), exist_ok=True)
        self.port = free_port()
        self.conf = os.path.join(self.dir, "nginx.conf")
        with open(self.conf, "w") as f:
            f.write((config or nginx_config)(self.dir, daemon_port, upstream_port,
                                             self.port))
        self.log_path = os.path.join(self.dir, "stderr.log")
        self.globals = ("daemon off; master_process off; pid %s/nginx.pid; "
                        "error_log stderr;" % self.dir)
        self.proc = None

    def cmd(self, *extra):
        return [NGINX, "-p", self.dir + "/", "-c", self.conf, "-g", self.globals] + list(extra)

    def start(self):
        test = subprocess.run(self.cmd("-t"), capture_output=True, text=True)
        assert test.returncode == 0, "nginx -t failed:\n" + test.stderr
        self.logf = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.cmd(), stdout=self.logf, stderr=self.logf)

        def listening():
            assert self.proc.poll() is None
            # nginx writes its pid file only once every listen socket is
            # bound: a connection before that could reach another owner of
            # the port while nginx is still retrying bind()
            assert os.path.exists(os.path.join(self.dir, "nginx.pid"))
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                return True
        assert wait_until(listening, timeout=10), "nginx did not start:\n" + self.log()
        return self

    def url(self, path):
        return "http://127.0.0.1:%d%s" % (self.port, path)

    def log(self):
        return read_log(self.log_path)

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc is not None:
            self.logf.close()


@pytest.fixture
def upstream():
    u = Upstream()
    yield u
    u.close()


@pytest.fixture
def gateway(tmp_path, start_daemon, upstream):
    """nginx from the recipe, in front of `upstream`, asking a real daemon."""
    daemon = start_daemon(POLICY)
    gw = Nginx(tmp_path, daemon.port, upstream.port).start()
    gw.daemon = daemon
    yield gw
    gw.stop()


def get(gw, path, method="GET", **kw):
    kw.setdefault("timeout", 5)
    try:
        return requests.request(method, gw.url(path), **kw)
    except requests.RequestException as e:
        # what nginx and the daemon said is what tells a stall's cause
        raise AssertionError("%s %s: %r\nnginx:\n%s\ndaemon:\n%s" % (
            method, path, e, gw.log(), gw.daemon.log())) from e


def test_allowed_then_429_with_headers_copied(gateway, upstream, redis_server):
    for i in range(3):
        r = get(gateway, "/api/items?page=%d" % i)
        assert r.status_code == 200, (r.status_code, r.text, gateway.log())
        assert r.text == "upstream ok"
        assert r.headers["X-RateLimit-Limit"] == "3"
        assert r.headers["X-RateLimit-Remaining"] == str(2 - i)
        reset = int(r.headers["X-RateLimit-Reset"])
        assert 1 <= reset <= 60
        assert "Retry-After" not in r.headers
        # The IETF fields (ietf_headers: true) are copied too.
        assert r.headers["RateLimit-Policy"] == '"w";q=3;w=60'
        assert r.headers["RateLimit"] == '"w";r=%d;t=%d' % (2 - i, reset)

    r = get(gateway, "/api/items")
    assert r.status_code == 429, (r.status_code, r.text, gateway.log())
    assert r.headers["X-RateLimit-Limit"] == "3"
    assert r.headers["X-RateLimit-Remaining"] == "0"
    retry = int(r.headers["Retry-After"])
    assert 1 <= retry <= 60
    assert r.headers["Content-Type"].startswith("application/json")
    assert json.loads(r.text) == {"error": "rate_limited", "retry_after": retry}
    assert r.headers["RateLimit-Policy"] == '"w";q=3;w=60'
    assert r.headers["RateLimit"].startswith('"w";r=0;t=')

    # The denied request never reached the application.
    assert upstream.count("/api/") == 3
    # The daemon saw the original path (X-Original-URI) and counted the
    # client nginx saw, under the contract's key.
    assert redis_server.client().exists("rl:{api:127.0.0.1}:w:sliding_window_log") == 1


def closed_toward(port):
    """Connections to 127.0.0.1:port that their client closed (TIME_WAIT
    on its side): a gateway's that it did not keep alive."""
    out = subprocess.run(["ss", "-Htn", "state", "time-wait", "dst", "127.0.0.1:%d" % port],
                         capture_output=True, text=True, check=True).stdout
    return len(out.splitlines())


@pytest.mark.skipif(shutil.which("ss") is None, reason="needs ss")
def test_denials_keep_the_connection_to_the_daemon(gateway, upstream):
    """auth_request reads no reply body, so a connection whose reply had one
    (a denial's JSON) could not go back to the keepalive pool: asked with
    GET, each denial cost a new TCP connection to the daemon, and a flood
    of denials a flood of connections (an audit). Asked with HEAD, no
    reply has a body."""
    for _ in range(3):
        assert get(gateway, "/api/items").status_code == 200
    before = closed_toward(gateway.daemon.port)
    for _ in range(20):
        assert get(gateway, "/api/items").status_code == 429
    for _ in range(5):  # missing_key's 403 has a body too
        assert get(gateway, "/keyed/x").status_code == 403
    assert closed_toward(gateway.daemon.port) - before <= 1, gateway.log()


def test_unmatched_path_passes_without_headers(gateway, upstream):
    for _ in range(6):
        r = get(gateway, "/static/app.js")
        assert r.status_code == 200, (r.status_code, r.text, gateway.log())
        assert r.text == "upstream ok"
        for h in RL:
            assert h not in r.headers
    assert upstream.count("/static/") == 6


def test_upload_body_is_not_sent_to_the_daemon(gateway, upstream):
    # 512 KiB is within nginx's default client_max_body_size (1m) but far
    # over what the daemon accepts as a request body: it passes only
    # because the recipe sends the check headers-only.
    r = get(gateway, "/api/upload", method="POST", data=b"x" * (512 * 1024))
    assert r.status_code == 200, (r.status_code, r.text, gateway.log())
    assert r.text == "upstream ok"
    assert r.headers["X-RateLimit-Remaining"] == "2"


def test_client_address_comes_through_x_forwarded_for(gateway, upstream, redis_server):
    # The test client is on 127.0.0.1, a trusted proxy, so the address it
    # claims in X-Forwarded-For is the client; nginx appends 127.0.0.1 after
    # it and the daemon reads right to left. One client's exhaustion must
    # not touch another's quota.
    a = {"X-Forwarded-For": "203.0.113.9"}
    b = {"X-Forwarded-For": "203.0.113.10"}
    for _ in range(3):
        assert get(gateway, "/api/a", headers=a).status_code == 200
    assert get(gateway, "/api/a", headers=a).status_code == 429
    r = get(gateway, "/api/b", headers=b)
    assert r.status_code == 200, (r.status_code, r.text, gateway.log())
    assert r.headers["X-RateLimit-Remaining"] == "2"
    keys = {k.decode() for k in redis_server.client().keys("rl:*")}
    assert keys == {"rl:{api:203.0.113.9}:w:sliding_window_log",
                    "rl:{api:203.0.113.10}:w:sliding_window_log"}


def request_from(gw, source_ip, path, headers):
    """A GET to nginx from another loopback address (all of 127/8 is local
    on Linux), so nginx sees a client outside trusted_proxies."""
    conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=5,
                                      source_address=(source_ip, 0))
    try:
        conn.request("GET", path, headers=headers)
        r = conn.getresponse()
        r.read()
        return r.status
    finally:
        conn.close()


def test_forged_forwarded_for_is_ignored(gateway, upstream, redis_server):
    # A client that is not a trusted proxy makes up X-Forwarded-For. nginx
    # appends the address it really saw, the daemon reads right to left and
    # stops at that untrusted address: a new made-up address per request
    # buys nothing.
    codes = [request_from(gateway, "127.0.0.2", "/api/f",
                          {"X-Forwarded-For": "198.51.100.%d" % i})
             for i in range(4)]
    assert codes == [200, 200, 200, 429], gateway.log()
    keys = {k.decode() for k in redis_server.client().keys("rl:*")}
    assert keys == {"rl:{api:127.0.0.2}:w:sliding_window_log"}


def test_original_method_is_passed(gateway, upstream):
    # The recipe always asks the daemon with GET (proxy_method) and sends the
    # real method in X-Original-Method; the login route limits POST only.
    for _ in range(4):
        r = get(gateway, "/auth/login")
        assert r.status_code == 200
        assert "X-RateLimit-Limit" not in r.headers
    for i in range(2):
        r = get(gateway, "/auth/login", method="POST", data=b"user=a&pass=b")
        assert r.status_code == 200, (r.status_code, r.text, gateway.log())
        assert r.headers["X-RateLimit-Remaining"] == str(1 - i)
    r = get(gateway, "/auth/login", method="POST", data=b"user=a&pass=b")
    assert r.status_code == 429
    assert int(r.headers["Retry-After"]) >= 1
    assert upstream.count("/auth/login") == 6


def test_original_host_is_passed(gateway, upstream):
    # proxy_pass would send Host: ratelimitd; X-Forwarded-Host carries the
    # client's host, which the `hosted` route matches on.
    h = {"Host": "api.example.com"}
    r = get(gateway, "/h/x", headers=h)
    assert r.status_code == 200
    assert r.headers["X-RateLimit-Limit"] == "1"
    assert get(gateway, "/h/x", headers=h).status_code == 429
    r = get(gateway, "/h/x", headers={"Host": "other.example.com"})
    assert r.status_code == 200
    assert "X-RateLimit-Limit" not in r.headers


def test_missing_key_stays_403(gateway, upstream):
    # The daemon's 403 for missing_key: deny has no Retry-After, and the
    # recipe keeps it a 403 rather than calling it a rate limit.
    r = get(gateway, "/keyed/x")
    assert r.status_code == 403, (r.status_code, r.text, gateway.log())
    assert "Retry-After" not in r.headers
    assert json.loads(r.text) == {"error": "missing_key"}
    assert upstream.count("/keyed/") == 0
    r = get(gateway, "/keyed/x", headers={"X-Api-Key": "k1"})
    assert r.status_code == 200
    assert r.headers["X-RateLimit-Limit"] == "100"
    assert r.headers["X-RateLimit-Remaining"] == "99"


CLOSED_POLICY = """\
server:
  listen: 127.0.0.1:{port}
  deny_status: 403
  ietf_headers: true
redis:
  address: 127.0.0.1:{redis_port}
  timeout: 100ms
failure_mode: closed
routes:
""" + API_ROUTE


def test_daemon_failing_closed_gives_503(tmp_path, start_daemon, upstream):
    # No Redis answers: a route with failure_mode: closed gets the daemon's
    # 503, which auth_request turns into a 500; the recipe makes it a 503
    # again, and the application is not reached. Unmatched paths still pass.
    daemon = start_daemon(CLOSED_POLICY, wait_ready=False, redis_port=free_port())
    gw = Nginx(tmp_path, daemon.port, upstream.port).start()
    try:
        r = get(gw, "/api/x")
        assert r.status_code == 503, (r.status_code, r.text, gw.log())
        assert json.loads(r.text) == {"error": "rate_limiter_unavailable"}
        # the daemon's headers, as SPEC's fail-closed reply has them
        assert r.headers["X-RateLimit-Limit"] == "3"
        assert r.headers["X-RateLimit-Remaining"] == "-1"
        # and, with ietf_headers, the policy (a failed check has no
        # RateLimit field: nothing is known of what remains)
        assert r.headers.get("RateLimit-Policy") == '"w";q=3;w=60', r.headers
        assert "RateLimit" not in r.headers
        assert upstream.count("/") == 0
        assert get(gw, "/other").status_code == 200
    finally:
        gw.stop()


def test_unreachable_daemon_fails_closed(tmp_path, upstream):
    # Nothing listens on the daemon's port: auth_request answers 500 and the
    # application is not reached.
    gw = Nginx(tmp_path, free_port(), upstream.port).start()
    try:
        r = get(gw, "/api/x")
        assert r.status_code == 500
        assert r.json() == {"error": "rate_limiter_unreachable"}, r.text
        assert upstream.count("/") == 0
    finally:
        gw.stop()


# ingress-nginx's auth-url, as its template (rootfs/etc/nginx/template/
# nginx.tmpl) writes the auth location without auth-method: the original
# request only in X-Original-URL, Host the auth service's, the client in
# X-Real-IP and X-Forwarded-For; then the two lines the README's
# auth-proxy-set-headers ConfigMap adds, as buildAuthProxySetHeaders
# renders them. Paths as nginx_config's.
INGRESS = """\
events {{ }}
http {{
    access_log off;
    client_body_temp_path {dir}/client_body;
    proxy_temp_path {dir}/proxy;
    {temps}
    server {{
        listen 127.0.0.1:{listen};
        location / {{
            auth_request /_external-auth;
            auth_request_set $auth_limit $upstream_http_x_ratelimit_limit;
            proxy_set_header X-RateLimit-Limit $auth_limit;
            proxy_pass http://127.0.0.1:{upstream};
        }}
        location = /_external-auth {{
            internal;
            proxy_pass_request_body     off;
            proxy_set_header            Content-Length          "";
            proxy_set_header            X-Forwarded-Proto       "";
            proxy_set_header            Host                    ratelimitd.default.svc;
            proxy_set_header            X-Original-URL          $scheme://$http_host$request_uri;
            proxy_set_header            X-Original-Method       $request_method;
            proxy_set_header            X-Sent-From             "nginx-ingress-controller";
            proxy_set_header            X-Real-IP               $remote_addr;
            proxy_set_header            X-Forwarded-For         $remote_addr;
            proxy_set_header            X-Auth-Request-Redirect $request_uri;
            proxy_set_header 'X-Forwarded-Host' '$host';
            proxy_set_header 'X-Original-URI' '$request_uri';
            proxy_http_version          1.1;
            proxy_pass http://127.0.0.1:{daemon}/check;
        }}
    }}
}}
"""


def ingress_config(tmpdir, daemon_port, upstream_port, listen_port):
    version = subprocess.run([NGINX, "-V"], capture_output=True, text=True).stderr
    temps = " ".join("%s_temp_path %s/%s;" % (m, tmpdir, m) for m in ("fastcgi", "uwsgi", "scgi")
                     if "--without-http_%s_module" % m not in version)
    return INGRESS.format(dir=tmpdir, temps=temps, listen=listen_port,
                          upstream=upstream_port, daemon=daemon_port)


def test_ingress_nginx_auth_url(tmp_path, start_daemon, upstream):
    """ingress-nginx's auth location, in a real nginx, with the README's
    two headers: the daemon judges the client's path, method and host (the
    controller alone names them only in X-Original-URL, with Host its own),
    and a client's own forwarding headers, which the controller passes
    along, choose nothing (a review found them believed)."""
    daemon = start_daemon(POLICY)
    gw = Nginx(tmp_path, daemon.port, upstream.port, config=ingress_config).start()
    gw.daemon = daemon
    try:
        host = {"Host": "api.example.com"}
        got = [get(gw, "/h/x?i=%d" % i, "DELETE", headers=host) for i in range(3)]
        assert [r.status_code for r in got] == [200, 403, 403], \
            ([(r.status_code, r.text) for r in got], daemon.log())
        assert got[0].text == "upstream ok" and upstream.count("/h/") == 1
        spoof = dict(host, **{"X-Original-URI": "/free", "X-Forwarded-Uri": "/free",
                              "X-Forwarded-Host": "other.example.com"})
        assert get(gw, "/h/x", "DELETE", headers=spoof).status_code == 403
        # another host: no route but the API's own, so it passes
        for _ in range(3):
            assert get(gw, "/h/x", headers={"Host": "other.example.com"}).status_code == 200
        # the /api/ route, keyed by the client IP nginx saw
        got = [get(gw, "/api/v", "POST") for _ in range(4)]
        assert [r.status_code for r in got] == [200, 200, 200, 403], daemon.log()
    finally:
        gw.stop()
