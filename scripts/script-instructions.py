#!/usr/bin/python3
"""Machine instructions Redis spends per check of the limits script.

Runs a redis-server of its own under valgrind's callgrind, on a unix socket
in a temporary directory, loads the script (default build/limits.lua) and
sends it the daemon's calls for three routes of the bench (`fw`: one
fixed_window; `tb`: one token_bucket; `three`: fixed_window, token_bucket
and gcra) over 1,000 clients whose keys already exist, in calls of 1 and of
16 checks. It counts what Redis runs to read each call, run it and write
its reply (readQueryFromClient and writeToClient, with everything they
call), and prints the instructions per call and per check.

Instruction counts do not depend on what else the machine is doing, so two
versions of the script compare in one run each, where times on a shared
machine swing by a quarter. A callgrind instruction is not a cycle: a
count says where the work is, not how long it takes.

Usage: scripts/script-instructions.py [SCRIPT] [ROUTE,ROUTE...]
Needs valgrind, redis-server and python3-redis (Debian packages).
"""
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import time

import redis

LIMITS = {
    "fixed_window": ("fixed_window", 1000000, 3600000000, 0),
    "token_bucket": ("token_bucket", 1000000, 100000, 1000000),
    "gcra": ("gcra", 1000000, 100000, 1000000),
}
ROUTES = {
    "fw": ["fixed_window"],
    "tb": ["token_bucket"],
    "three": ["fixed_window", "token_bucket", "gcra"],
}
CLIENTS = 1000
CALLS = 100


def call_args(route, n, first):
    """KEYS and ARGV of one call of n checks on route, clients first..."""
    limits = [LIMITS[a] for a in ROUTES[route]]
    keys = []
    argv = ["0", "1", str(len(limits))]
    for lim in limits:
        argv += [str(x) for x in lim]
    for i in range(n):
        client = (first + i) % CLIENTS
        keys += ["rl:{%s:%d}:%s:%s" % (route, client, a, a) for a in ROUTES[route]]
        argv += ["1", "1"]
    return keys, argv


def main():
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
    script = sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "build", "limits.lua")
    routes = sys.argv[2].split(",") if len(sys.argv) > 2 else list(ROUTES)
    for tool in ("valgrind", "callgrind_control", "redis-server"):
        if shutil.which(tool) is None:
            sys.exit("script-instructions: %s not found (Debian: valgrind, redis-server)" % tool)
    with open(script) as f:
        source = f.read()
    work = tempfile.mkdtemp(prefix="ratelimitd-instr.")
    sock = os.path.join(work, "redis.sock")
    server = subprocess.Popen(
        ["valgrind", "--tool=callgrind", "--toggle-collect=readQueryFromClient",
         "--toggle-collect=writeToClient", "--callgrind-out-file=" + work + "/cg.%p",
         "redis-server", "--port", "0", "--unixsocket", sock, "--save", "",
         "--appendonly", "no", "--dir", work],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        r = redis.Redis(unix_socket_path=sock)
        for _ in range(300):
            try:
                r.ping()
                break
            except redis.exceptions.ConnectionError:
                time.sleep(0.1)
        sha = r.script_load(source)

        def control(what):
            subprocess.run(["callgrind_control", what, str(server.pid)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)

        def collected():
            """Instructions counted since the last zero (a dump reads them)."""
            control("-d")
            for _ in range(100):
                dumps = glob.glob(os.path.join(work, "cg.*.*"))
                if dumps:
                    break
                time.sleep(0.1)
            total = 0
            for path in dumps:
                with open(path) as f:
                    for line in f:
                        if line.startswith("summary:"):
                            total += int(line.split()[1])
                os.unlink(path)
            return total

        print("| route | checks per call | instructions per call | per check |")
        print("|---|---|---|---|")
        for route in routes:
            for n in (1, 16):
                for first in range(0, CLIENTS, n):     # every key exists
                    keys, argv = call_args(route, n, first)
                    r.evalsha(sha, len(keys), *keys, *argv)
                control("-z")
                for c in range(CALLS):
                    keys, argv = call_args(route, n, c * n)
                    r.evalsha(sha, len(keys), *keys, *argv)
                total = collected()
                print("| %s | %d | %.0f | %.0f |" % (route, n, total / CALLS, total / CALLS / n))
    finally:
        server.terminate()
        server.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
