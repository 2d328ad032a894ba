"""Builds the limits script the way `make` builds build/limits.lua.

The daemon loads ONE script: scripts/lib.lua, then one file per algorithm in
the order below, then scripts/main.lua. The tests build it here so they do
not depend on the Makefile, and check that the order agrees with the
Makefile's ALGORITHMS variable when there is a Makefile.
"""
import os
import re

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPTS = os.path.join(ROOT, "scripts")

ALGORITHMS = ["fixed_window", "token_bucket", "sliding_window_log",
              "sliding_window_counter", "leaky_bucket", "gcra"]


def script_files():
    return ([os.path.join(SCRIPTS, "lib.lua")]
            + [os.path.join(SCRIPTS, a + ".lua") for a in ALGORITHMS]
            + [os.path.join(SCRIPTS, "main.lua")])


def build_script():
    parts = []
    for path in script_files():
        with open(path) as f:
            text = f.read()
        parts.append(text if text.endswith("\n") else text + "\n")
    return "".join(parts)


def makefile_algorithms():
    """The Makefile's ALGORITHMS list, or None when there is no Makefile
    (or it does not define the variable)."""
    path = os.path.join(ROOT, "Makefile")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        text = f.read().replace("\\\n", " ")
    m = re.search(r"^ALGORITHMS\s*[:?]?=\s*(.*)$", text, re.M)
    if not m:
        return None
    return m.group(1).split()


class Limits:
    """The limits script on a real Redis: SCRIPT LOAD once, EVALSHA per call.
    A limit is (algorithm, a, b, c) exactly as the daemon passes it."""

    def __init__(self, r):
        self.r = r
        self.sha = r.script_load(build_script())

    @staticmethod
    def batch_args(now_us, checks):
        """KEYS and ARGV of a call that carries several checks, each given
        as (keys, limits, cost), decided in that order. ARGV is the time,
        the number of distinct limit sets, each set once (its limit count,
        then per limit the algorithm and a, b, c), then per check the index
        of its set (from 1) and its cost."""
        keys, sets, check_argv = [], [], []
        for ck_keys, limits, cost in checks:
            assert len(ck_keys) == len(limits)
            limits = tuple(tuple(lim) for lim in limits)
            if limits not in sets:
                sets.append(limits)
            keys += ck_keys
            check_argv += [str(sets.index(limits) + 1), str(cost)]
        argv = [str(now_us), str(len(sets))]
        for limits in sets:
            argv.append(str(len(limits)))
            for alg, a, b, c in limits:
                argv += [alg, str(a), str(b), str(c)]
        return keys, argv + check_argv

    @staticmethod
    def args(now_us, cost, limits):
        """ARGV of a call that carries one check."""
        return Limits.batch_args(now_us, [([None] * len(limits), limits, cost)])[1]

    def call(self, keys, limits, now_us, cost=1):
        assert len(keys) == len(limits)
        return [int(x) for x in self.r.evalsha(
            self.sha, len(keys), *keys, *self.args(now_us, cost, limits))]

    def call_batch(self, checks, now_us):
        """Runs several checks in one call; returns one reply list per
        check, sliced as the daemon slices them (2 + 5 per limit)."""
        keys, argv = self.batch_args(now_us, checks)
        flat = [int(x) for x in self.r.evalsha(self.sha, len(keys), *keys, *argv)]
        out, i = [], 0
        for _, limits, _ in checks:
            n = 2 + 5 * len(limits)
            out.append(flat[i:i + n])
            i += n
        assert i == len(flat), (i, len(flat))
        return out


# Added by the probe wrapper to the expiries it sets (see build_probe_script):
# 10^9 ms, 11.6 days, far beyond any expiry a script sets.
PROBE_OFFSET_MS = 10 ** 9


def build_probe_script():
    """The real script, unchanged, run as a function by a test wrapper that
    plays a forced clock's expiry around it, in the same script call.

    The wrapper takes one extra ARGV entry per key, after the script's own,
    and removes them before the script runs: the key's expiry at the forced
    time, in ms (0: it has expired, delete it; -1: leave it alone). It sets
    those, PROBE_OFFSET_MS later than asked so that the real clock cannot
    expire them during the call (a Redis preempted for a few ms would), runs
    the script, reads each key's expiry and PERSISTs it, so the real clock
    expires nothing between calls while the harness expires keys on the
    forced clock: an expiry set too early loses state that still matters
    and shows as a wrong decision. The expiry (ms) read back is bracketed
    exactly: PEXPIRE counts from the real clock at the call, which lies
    between the TIME read before the wrapper's PEXPIREs and after the
    script.
    Reply: {script reply, {per key: lo, hi}, elapsed_ms}: the expiry is in
    [lo, hi]; lo = hi = -2 when the key does not exist (-1: no expiry); an
    expiry the script left as the wrapper set it reads PROBE_OFFSET_MS
    higher (no script sets one that long)."""
    return ("local function ratelimitd_limits()\n" + build_script() + "end\n"
            "local function clock_ms()\n"
            "  local t = redis.call('TIME')\n"
            "  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"
            "end\n"
            "local expiry = {}\n"
            "for i = #KEYS, 1, -1 do\n"
            "  expiry[i] = tonumber(ARGV[#ARGV])\n"
            "  ARGV[#ARGV] = nil\n"
            "end\n"
            "local before = clock_ms()\n"
            "for i = 1, #KEYS do\n"
            "  if expiry[i] == 0 then\n"
            "    redis.call('DEL', KEYS[i])\n"
            "  elseif expiry[i] > 0 then\n"
            "    redis.call('PEXPIRE', KEYS[i], expiry[i] + " + str(PROBE_OFFSET_MS) + ")\n"
            "  end\n"
            "end\n"
            "local reply = ratelimitd_limits()\n"
            "local after = clock_ms()\n"
            "local ttls = {}\n"
            "for i = 1, #KEYS do\n"
            "  local at = redis.call('PEXPIRETIME', KEYS[i])\n"
            "  if at < 0 then\n"
            "    ttls[#ttls + 1] = at\n"
            "    ttls[#ttls + 1] = at\n"
            "  else\n"
            "    ttls[#ttls + 1] = at - after\n"
            "    ttls[#ttls + 1] = at - before\n"
            "  end\n"
            "  redis.call('PERSIST', KEYS[i])\n"
            "end\n"
            "return {reply, ttls, after - before}\n")
