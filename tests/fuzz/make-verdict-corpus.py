#!/usr/bin/python3
"""Writes the seed corpus of fuzz_verdict (tests/fuzz/verdict-corpus/):
inputs in the byte format fuzz_verdict.c reads, for the policies, script
replies and deny cache sequences a worker meets. Run it again after that
format changes: python3 tests/fuzz/make-verdict-corpus.py"""
import os
import struct

NAME_CHARS = ("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
              "0123456789_.-")
ALGS = ["fixed_window", "token_bucket", "sliding_window_log",
        "sliding_window_counter", "leaky_bucket", "gcra"]
UNITS = {"ms": 0, "s": 1, "m": 2, "h": 3, "d": 4}


def number(v):
    """Exactly v, through number()'s "any" class: 1 + x % max."""
    return struct.pack(">Q", v - 1) + bytes([2])


def duration(n, unit):
    return bytes([UNITS[unit]]) + number(n)


def limit(alg, name=None, limit=None, window=None, precision=None,
          rate=None, burst=None, delay=None):
    """One limit: window=(n, unit), precision=(ms, buckets), rate=(count,
    n, unit); name without its first character, which is the index's."""
    a = ALGS.index(alg)
    flags = (1 if name is not None else 0) | (2 if precision else 0)
    if delay is not None:
        flags |= 4 | (8 if delay else 0)
    out = bytes([a, flags])
    if name is not None:
        out += bytes([len(name)]) + bytes(NAME_CHARS.index(c) for c in name)
    if alg in ("fixed_window", "sliding_window_log", "sliding_window_counter"):
        out += number(limit)
        if precision:
            out += number(precision[0]) + number(precision[1])
        else:
            out += duration(*window)
    else:
        out += number(burst) + number(rate[0]) + duration(rate[1], rate[2])
    return out


def reply_int(v):
    return struct.pack(">q", v) + bytes([7])


def reply(ints, exact=True):
    """The script's reply; exact=False sends it whatever its length."""
    n = 0 if exact else 2 * len(ints) + 1
    return bytes([n]) + b"".join(reply_int(v) for v in ints)


def op(put, policy=0, route=0, client=0, cost=1, link=1, advance_us=0,
       ints=(), latency_us=0):
    """A deny cache step: the clock moves advance_us (< 20 s), then a put
    of the script reply ints (sent latency_us before) or a get."""
    what = (1 if put else 0) | policy << 1 | route << 2
    out = bytes([what, client, cost - 1, link - 1, 2])
    out += struct.pack(">Q", advance_us)
    if put:
        out += b"".join(reply_int(v) for v in ints)
        out += struct.pack(">Q", latency_us)
    return out


def seed(limits, ints, ops=(), exact=True):
    return (bytes([len(limits) - 1]) + b"".join(limits) +
            reply(ints, exact) + struct.pack(">Q", 0) + b"".join(ops))


def main():
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                        "verdict-corpus")
    os.makedirs(here, exist_ok=True)
    api = [limit("token_bucket", "urst", rate=(10, 1, "s"), burst=20),
           limit("fixed_window", "ourly", limit=1000, window=(1, "h"))]
    allowed = [1, 5000, 1, 3, 200, 0, 0, 1, 977, 1800000, 0, 0]
    denied = [0, 5000, 0, 0, 2000, 150, 0, 1, 977, 1800000, 0, 0]
    seeds = {
        # README's api route: allowed, then a denial cached and asked
        # again by the same and by other clients, links and policies
        "api-allowed": seed(api, allowed),
        "api-denied-cached": seed(api, denied, [
            op(True, ints=[0, 5000, 0, 0, 2000, 1500, 0, 1, 977, 1800000,
                           0, 0], latency_us=300),
            op(False, advance_us=1000),
            op(False, client=1),
            op(False, link=2),
            op(False, policy=1),
            op(False, route=1),
            op(False, cost=2),
            op(False, advance_us=600000),
            op(False, advance_us=1000000)]),
        "api-tie": seed(api, [1, 5000, 1, 5, 1000, 0, 0, 1, 5, 1800001,
                              0, 0]),
        "login-log": seed([limit("sliding_window_log", "er-minute",
                                 limit=5, window=(1, "m"))],
                          [0, 1, 0, 0, 100, 100, 0], [
            op(True, ints=[0, 1, 0, 0, 100, 100, 0]),
            op(False, advance_us=10)]),
        "uploads-leaky": seed([limit("leaky_bucket", "ueue", rate=(5, 1, "s"),
                                     burst=10, delay=False)],
                              [1, 7000, 1, 9, 200, 0, 0]),
        "shaped-leaky": seed([limit("leaky_bucket", rate=(2, 1, "s"),
                                    burst=4)],
                             [1, 7000, 1, 0, 2000, 0, 1500]),
        "default-counter": seed([limit("sliding_window_counter", limit=100,
                                       precision=(5000, 12))],
                                [0, 9000, 0, 0, 60000, 4000, 0]),
        "partner-gcra": seed([limit("gcra", rate=(100, 1, "s"), burst=50)],
                             [0, 9000, 0, 0, 500, 10, 0], [
            op(True, ints=[0, 9000, 0, 0, 500, 10, 0], client=3),
            op(False, client=3, advance_us=5000),
            op(False, client=3, advance_us=5000)]),
        "fixed-window-empty": seed(
            [limit("fixed_window", "ive", limit=5, window=(10, "s")),
             limit("gcra", "ne", rate=(1, 1, "s"), burst=1)],
            [0, 9000, 0, 0, 4000, 4000, 0, 1, 1, 1000, 0, 0], [
                op(True, ints=[0, 9000, 0, 0, 4000, 4000, 0, 1, 1, 1000, 0,
                               0], cost=3),
                op(False, cost=3, advance_us=100),
                op(False, cost=1, advance_us=100)]),
        "wrong-length": seed(api, allowed[:11], exact=False),
        "three": seed([limit("fixed_window", limit=10, window=(1, "s")),
                       limit("fixed_window", limit=100, window=(1, "m")),
                       limit("token_bucket", rate=(5, 1, "s"), burst=5)],
                      [1, 1, 1, 9, 1000, 0, 0, 1, 99, 60000, 0, 0, 1, 4, 200,
                       0, 0]),
    }
    for name, data in seeds.items():
        with open(os.path.join(here, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
