#!/usr/bin/python3
"""Watcher for `make soak`: polls the daemon's GET /healthz and samples its
RSS until a stop file appears (or MAX_SECONDS pass), then writes a summary.

    monitor.py PID PORT STOPFILE OUTFILE MAX_SECONDS

Every 0.25 s: one GET /healthz on a new connection, with a 1 s timeout (a
poll that fails, times out or is not `200 ok` is a miss, and so is
finding the daemon dead); VmRSS from /proc/PID/status; whether PID is
still alive (a zombie is dead). OUTFILE gets one "name value" a line:
polls, misses, max_ms (slowest healthz), rss_max_kb, rss_last_kb, died (0
or 1), an "rss SECONDS KB" line every 5 s, and a "miss ..." line for each
of the first 20 misses saying when and what.
"""
import http.client
import os
import sys
import time

HEALTHZ_TIMEOUT_S = 1.0
PERIOD_S = 0.25


def alive(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("State:"):
                    return "Z" not in line.split()[1]
    except OSError:
        return False
    return False


def rss_kb(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def healthz(port):
    """(ok, seconds, what)"""
    t0 = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=HEALTHZ_TIMEOUT_S)
    try:
        conn.request("GET", "/healthz")
        r = conn.getresponse()
        body = r.read()
        dt = time.monotonic() - t0
        if r.status != 200 or body.strip() != b"ok":
            return False, dt, "status %d body %r" % (r.status, body[:60])
        if dt > HEALTHZ_TIMEOUT_S:
            return False, dt, "took %.3f s" % dt
        return True, dt, ""
    except (OSError, http.client.HTTPException) as e:
        return False, time.monotonic() - t0, "%s: %s" % (type(e).__name__, e)
    finally:
        conn.close()


def main():
    pid, port, stopfile, outfile, max_s = (int(sys.argv[1]), int(sys.argv[2]),
                                           sys.argv[3], sys.argv[4], float(sys.argv[5]))
    start = time.monotonic()
    polls = misses = 0
    max_dt = 0.0
    rss_max = rss_last = 0
    died = 0
    miss_lines = []
    rss_lines = []
    next_rss = 0.0
    while not os.path.exists(stopfile) and time.monotonic() - start < max_s:
        t = time.monotonic()
        if not alive(pid):
            died = 1
            misses += 1
            miss_lines.append("miss %.1f daemon not alive" % (t - start))
            break
        r = rss_kb(pid)
        if r is not None:
            rss_last = r
            rss_max = max(rss_max, r)
            if t - start >= next_rss:
                rss_lines.append("rss %.0f %d" % (t - start, r))
                next_rss += 5.0
        ok, dt, what = healthz(port)
        polls += 1
        max_dt = max(max_dt, dt)
        if not ok:
            misses += 1
            if len(miss_lines) < 20:
                miss_lines.append("miss %.1f %s" % (t - start, what))
        time.sleep(max(0.0, PERIOD_S - (time.monotonic() - t)))
    with open(outfile + ".tmp", "w") as f:
        f.write("polls %d\nmisses %d\nmax_ms %.0f\nrss_max_kb %d\nrss_last_kb %d\ndied %d\n"
                % (polls, misses, max_dt * 1000, rss_max, rss_last, died))
        for line in rss_lines + miss_lines:
            f.write(line + "\n")
    os.rename(outfile + ".tmp", outfile)


if __name__ == "__main__":
    main()
