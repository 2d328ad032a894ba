"""Reference models of the six rate-limit algorithms (SPEC section 6).

Plain Python written from the definitions in ALGORITHMS.md, not from the Lua:
state is kept the way each algorithm is usually described (a counter, a list
of times, buckets, a token count, a queue level, a TAT), with exact rational
arithmetic (fractions.Fraction). Times are integer microseconds.

Each model answers four questions about its state at a time t, without
changing it:
    admits(t, cost)   would a request of this cost pass?
    left(t)           quota left (a Fraction; the reply floors it)
    empty(t)          is the limit back to full quota?
    delay(t)          how long an admitted request is held (leaky bucket)
and charge(t, cost) records an admitted request.

Everything else in a reply follows from those with one generic rule, which
is what makes the comparison with the scripts meaningful:
    retry_after = the first integer microsecond u >= 0 at which admits()
                  becomes true (found by search, since without new charges
                  every algorithm only ever frees capacity as time passes),
    reset       = the first u at which empty() becomes true.
A cost above the quota can never pass; its retry_after is a documented hint
(`impossible_retry`).
"""
import copy
import math
from fractions import Fraction


def ceil_ms(us):
    """Microseconds (int or Fraction) to whole milliseconds, rounded up."""
    if us <= 0:
        return 0
    return math.ceil(Fraction(us) / 1000)


def first_true(pred, limit=1 << 50):
    """Smallest integer u >= 0 with pred(u), pred monotone (false..true)."""
    if pred(0):
        return 0
    hi = 1
    while not pred(hi):
        hi *= 2
        if hi > limit:
            raise AssertionError("predicate never becomes true")
    lo = hi // 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if pred(mid):
            hi = mid
        else:
            lo = mid
    return hi


class Model:
    quota = None

    def delay(self, t):
        return 0

    def clone(self):
        return copy.deepcopy(self)


class WindowModel(Model):
    """The window algorithms: everything follows from count(t), the cost
    that counts against the limit at t."""

    def admits(self, t, cost):
        return self.count(t) + cost <= self.quota

    def left(self, t):
        return self.quota - self.count(t)

    def empty(self, t):
        return self.count(t) == 0


class FixedWindow(WindowModel):
    """A counter per aligned window [k*W, (k+1)*W)."""

    def __init__(self, limit, window):
        self.quota, self.W = limit, window
        self.start, self.n = None, 0

    def count(self, t):
        return self.n if self.start == t // self.W * self.W else 0

    def charge(self, t, cost):
        self.n = self.count(t) + cost
        self.start = t // self.W * self.W

    def impossible_retry(self, t):
        return first_true(lambda u: self.empty(t + u)) + self.W


class SlidingWindowLog(WindowModel):
    """Exact: the times of the admitted requests (one per unit of cost); the
    count at t is how many lie in the window (t - W, t]."""

    def __init__(self, limit, window):
        self.quota, self.W = limit, window
        self.times = []

    def count(self, t):
        return sum(1 for x in self.times if x > t - self.W)

    def charge(self, t, cost):
        self.times.extend([t] * cost)

    def impossible_retry(self, t):
        return first_true(lambda u: self.empty(t + u)) + self.W


class SlidingWindowCounter(WindowModel):
    """Buckets of P microseconds ([k*P, (k+1)*P)) holding the cost admitted
    in them. The count at t over the window (t - W, t] takes each bucket for
    the part of its span [s, s+P) that lies after t - W, as if its requests
    were spread evenly over it:
        count(t) = sum n_s * clamp(s + P - (t - W), 0, P) / P
    (a bucket's requests are all <= t, so the current one counts in full)."""

    def __init__(self, limit, window, precision):
        self.quota, self.W, self.P = limit, window, precision
        self.buckets = {}

    def count(self, t):
        total = 0
        for s, n in self.buckets.items():
            inside = min(max(s + self.P - (t - self.W), 0), self.P)
            total += n * inside
        return Fraction(total, self.P)

    def charge(self, t, cost):
        s = t // self.P * self.P
        self.buckets[s] = self.buckets.get(s, 0) + cost

    def impossible_retry(self, t):
        return first_true(lambda u: self.empty(t + u)) + self.W


class TokenBucket(Model):
    """Tokens refill continuously at N per period up to burst; a request
    takes `cost` tokens. A fresh client has a full bucket."""

    def __init__(self, burst, n, period):
        self.quota, self.rate = burst, Fraction(n, period)
        self.tokens, self.ts = Fraction(burst), None

    def level(self, t):
        if self.ts is None:
            return Fraction(self.quota)
        return min(Fraction(self.quota), self.tokens + max(0, t - self.ts) * self.rate)

    def admits(self, t, cost):
        return self.level(t) >= cost

    def left(self, t):
        return self.level(t)

    def empty(self, t):
        return self.level(t) == self.quota

    def charge(self, t, cost):
        self.tokens, self.ts = self.level(t) - cost, t

    def impossible_retry(self, t):
        return first_true(lambda u: self.empty(t + u)) + math.ceil(self.quota / self.rate)


class LeakyBucket(Model):
    """A queue (meter) that drains at N per period and holds at most burst.
    A request of cost c joins it if the queue plus c fits in burst, and is
    served when the queue ahead of it has drained: delay = queue / rate."""

    def __init__(self, burst, n, period):
        self.quota, self.rate = burst, Fraction(n, period)
        self.queue, self.ts = Fraction(0), None

    def level(self, t):
        if self.ts is None:
            return Fraction(0)
        return max(Fraction(0), self.queue - max(0, t - self.ts) * self.rate)

    def admits(self, t, cost):
        return self.level(t) + cost <= self.quota

    def left(self, t):
        return self.quota - self.level(t)

    def empty(self, t):
        return self.level(t) == 0

    def delay(self, t):
        return self.level(t) / self.rate

    def charge(self, t, cost):
        self.queue, self.ts = self.level(t) + cost, t

    def impossible_retry(self, t):
        return first_true(lambda u: self.empty(t + u)) + math.ceil(self.quota / self.rate)


class GCRA(Model):
    """Generic cell rate algorithm: emission interval T = period/N, one
    theoretical arrival time TAT. A request of cost c conforms iff
    max(TAT, t) + c*T - t <= burst*T; it then sets TAT to max(TAT, t) + c*T.
    Quota left = (burst*T - max(TAT - t, 0)) / T."""

    def __init__(self, burst, n, period):
        self.quota, self.T = burst, Fraction(period, n)
        self.tat = None

    def backlog(self, t):
        return Fraction(0) if self.tat is None else max(Fraction(0), self.tat - t)

    def admits(self, t, cost):
        return self.backlog(t) + cost * self.T <= self.quota * self.T

    def left(self, t):
        return (self.quota * self.T - self.backlog(t)) / self.T

    def empty(self, t):
        return self.backlog(t) == 0

    def charge(self, t, cost):
        self.tat = t + self.backlog(t) + cost * self.T

    def impossible_retry(self, t):
        return first_true(lambda u: self.empty(t + u)) + math.ceil(self.quota * self.T)


MODELS = {
    "fixed_window": lambda a, b, c: FixedWindow(a, b),
    "sliding_window_log": lambda a, b, c: SlidingWindowLog(a, b),
    "sliding_window_counter": lambda a, b, c: SlidingWindowCounter(a, b, c),
    "token_bucket": lambda a, b, c: TokenBucket(a, b, c),
    "leaky_bucket": lambda a, b, c: LeakyBucket(a, b, c),
    "gcra": lambda a, b, c: GCRA(a, b, c),
}


def make(limit):
    """A fresh model for a limit (algorithm, a, b, c) as the daemon passes it."""
    alg, a, b, c = limit
    return MODELS[alg](a, b, c)


class Decision:
    """One limit's verdict, with exact (microsecond) times besides the
    millisecond reply fields."""

    def __init__(self, allowed, left, reset_us, retry_us, delay):
        self.allowed, self.left = allowed, left
        self.reset_us, self.retry_us, self.delay = reset_us, retry_us, delay


def decide(m, t, cost):
    """The verdict of one limit at t, before anything is charged."""
    allowed = m.admits(t, cost)
    if allowed:
        retry = 0
    elif cost > m.quota:
        retry = m.impossible_retry(t)
    else:
        retry = first_true(lambda u: m.admits(t + u, cost))
    reset = first_true(lambda u: m.empty(t + u))
    return Decision(allowed, m.left(t), reset, retry, m.delay(t) if allowed else 0)


def units(limit):
    """Characteristic durations (us) of a limit (algorithm, a, b, c) as the
    daemon passes it: windows, precisions, emission intervals rounded both
    ways, full refill. Tests pick time steps from these."""
    alg, a, b, c = limit
    if alg in ("fixed_window", "sliding_window_log"):
        return [b]
    if alg == "sliding_window_counter":
        return [b, c]
    t_lo, t_hi = c // b, -(-c // b)          # emission interval, rounded
    return sorted({t_lo, t_hi, a * c // b})


def route_call(models, t, cost):
    """One script call over all the limits of a route: allowed only if every
    limit allows, and then every limit is charged; otherwise none is.
    Returns the reply the script must give, and the per-limit decisions."""
    ds = [decide(m, t, cost) for m in models]
    ok = all(d.allowed for d in ds)
    reply = [1 if ok else 0, t // 1000]
    for m, d in zip(models, ds):
        if ok:
            m.charge(t, cost)
            left = m.left(t)
            reset = first_true(lambda u: m.empty(t + u))
            delay = d.delay
        else:
            left, reset, delay = d.left, d.reset_us, 0
        reply += [1 if d.allowed else 0, max(0, math.floor(left)), ceil_ms(reset),
                  0 if d.allowed else ceil_ms(d.retry_us), ceil_ms(delay)]
    return reply, ds


def would_pass(models, t, cost):
    return all(m.admits(t, cost) for m in models)
