#!/usr/bin/python3
"""Exactness probe for `make soak`: 2N concurrent /check requests for one
fresh key on a fixed_window route of limit N, each on its own connection,
released together by a barrier.

    exact.py PORT URI KEY N

Prints one "name value" a line: status_NNN for each status seen, degraded
(replies with X-RateLimit-Remaining: -1, answered by the failure mode, not
by Redis), failed (requests with no reply within 5 s).
"""
import http.client
import sys
import threading

port, uri, key, n = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
barrier = threading.Barrier(2 * n)
lock = threading.Lock()
counts = {}


def count(name):
    with lock:
        counts[name] = counts.get(name, 0) + 1


def one():
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.connect()
        barrier.wait(timeout=10)
        conn.request("GET", "/check", headers={"X-Original-URI": uri, "X-Api-Key": key})
        r = conn.getresponse()
        r.read()
        count("status_%d" % r.status)
        if r.getheader("X-RateLimit-Remaining") == "-1":
            count("degraded")
    except (OSError, http.client.HTTPException, threading.BrokenBarrierError):
        count("failed")
    finally:
        conn.close()


threads = [threading.Thread(target=one) for _ in range(2 * n)]
for t in threads:
    t.start()
for t in threads:
    t.join()
for name in sorted(counts):
    print(name, counts[name])
