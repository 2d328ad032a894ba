#!/bin/sh
# Measures what each rate-limit algorithm costs Redis, for the README table:
#   - memory: MEMORY USAGE of one client's key at steady state, after
#     `limit` requests (quota 100 for every algorithm), spread over one window
#     for the window algorithms, at once for the buckets (whose key then
#     lives for burst/rate = 1 s);
#   - CPU: Redis time per check, from INFO commandstats (usec_per_call of
#     evalsha) while redis-benchmark sends EVALSHA of the limits script with
#     that one limit over 10,000 random client keys, on the real clock: one
#     check per call, then eight per call (usec_per_call / 8), as the daemon
#     batches the checks that arrive together.
# It starts its own redis-server on a unix socket in a temporary directory
# (nothing listens on TCP) and stops it on exit.
# Usage: scripts/algorithm-costs.sh [checks per algorithm, default 100000]
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
n=${1:-100000}
tmp=$(mktemp -d)
sock=$tmp/redis.sock
redis_pid=""
cleanup() {
	if [ -n "$redis_pid" ]; then
		kill "$redis_pid" 2>/dev/null || true
		wait "$redis_pid" 2>/dev/null || true
	fi
	rm -rf "$tmp"
}
trap cleanup EXIT INT TERM

# The script exactly as `make` concatenates it (lib, algorithms, main).
algorithms=$(sed -n 's/^ALGORITHMS[[:space:]]*[:?]*=[[:space:]]*//p' "$root/Makefile" 2>/dev/null || true)
algorithms=${algorithms:-fixed_window token_bucket sliding_window_log sliding_window_counter leaky_bucket gcra}
{
	cat "$root/scripts/lib.lua"
	for a in $algorithms; do cat "$root/scripts/$a.lua"; done
	cat "$root/scripts/main.lua"
} > "$tmp/limits.lua"

redis-server --port 0 --unixsocket "$sock" --save '' --appendonly no \
	--dir "$tmp" --logfile "$tmp/redis.log" &
redis_pid=$!
i=0
until redis-cli -s "$sock" ping >/dev/null 2>&1; do
	i=$((i + 1))
	[ "$i" -lt 100 ] || { echo "algorithm-costs: redis-server did not start" >&2; exit 1; }
	sleep 0.05
done
cli() { redis-cli -s "$sock" "$@"; }
sha=$(cli -x script load < "$tmp/limits.lua")

# a b c (see scripts/main.lua) | spacing of the steady-state requests (us) | label
params() {
	case $1 in
	fixed_window)           echo "100 60000000 0|600000|100 per 1m" ;;
	sliding_window_log)     echo "100 60000000 0|600000|100 per 1m" ;;
	sliding_window_counter) echo "100 60000000 6000000|600000|100 per 1m, precision 6s" ;;
	token_bucket)           echo "100 100 1000000|0|burst 100, 100/s" ;;
	leaky_bucket)           echo "100 100 1000000|0|burst 100, 100/s" ;;
	gcra)                   echo "100 100 1000000|0|burst 100, 100/s" ;;
	esac
}

redis_version=$(cli info server | sed -n 's/^redis_version:\([^[:space:]]*\).*/\1/p')
echo "redis $redis_version, $(nproc) cores; $n checks per algorithm over 10000 keys"
echo
echo "| algorithm | limit | state (one key) | MEMORY USAGE at steady state | Redis CPU per check, one per call | in calls of 8 |"
echo "|---|---|---|---|---|---|"
for a in $algorithms; do
	p=$(params "$a")
	abc=${p%%|*}; rest=${p#*|}; step=${rest%%|*}; label=${rest#*|}
	# shellcheck disable=SC2086
	set -- $abc
	key="rl:{cost:client}:l:$a"
	t=1700000000000000
	k=0
	while [ "$k" -lt 100 ]; do
		cli evalsha "$sha" 1 "$key" "$t" 1 1 "$a" "$1" "$2" "$3" 1 1 >/dev/null
		t=$((t + step)); k=$((k + 1))
	done
	mem=$(cli memory usage "$key" samples 0)
	type=$(cli type "$key")
	case $type in
	zset) shape="zset, $(cli zcard "$key") members" ;;
	hash) shape="hash, $(cli hlen "$key") fields" ;;
	*)    shape="$type" ;;
	esac
	cli config resetstat >/dev/null
	redis-benchmark -s "$sock" -n "$n" -r 10000 -c 4 -q \
		evalsha "$sha" 1 "rl:{bench:__rand_int__}:l:$a" 0 1 1 "$a" "$1" "$2" "$3" 1 1 >/dev/null
	stats=$(cli info commandstats | grep '^cmdstat_evalsha:')
	usec=$(echo "$stats" | sed -n 's/.*usec_per_call=\([0-9.]*\).*/\1/p')
	calls=$(echo "$stats" | sed -n 's/.*[:,]calls=\([0-9]*\).*/\1/p')
	failed=$(echo "$stats" | sed -n 's/.*failed_calls=\([0-9]*\).*/\1/p')
	if [ "$calls" != "$n" ] || [ "${failed:-0}" != 0 ]; then
		echo "algorithm-costs: $a: $stats" >&2
		exit 1
	fi
	# The same checks eight to a call, as the daemon batches them.
	set -- "$1" "$2" "$3"
	# (one limit set, then eight checks of set 1 at cost 1)
	bkeys="" bargs="1 1 $a $1 $2 $3"
	for j in 1 2 3 4 5 6 7 8; do
		bkeys="$bkeys rl:{bench:__rand_int__$j}:l:$a"
		bargs="$bargs 1 1"
	done
	cli config resetstat >/dev/null
	# shellcheck disable=SC2086
	redis-benchmark -s "$sock" -n $((n / 8)) -r 10000 -c 4 -q \
		evalsha "$sha" 8 $bkeys 0 $bargs >/dev/null
	stats=$(cli info commandstats | grep '^cmdstat_evalsha:')
	busec=$(echo "$stats" | sed -n 's/.*usec_per_call=\([0-9.]*\).*/\1/p')
	failed=$(echo "$stats" | sed -n 's/.*failed_calls=\([0-9]*\).*/\1/p')
	if [ -z "$busec" ] || [ "${failed:-0}" != 0 ]; then
		echo "algorithm-costs: $a, batches of 8: $stats" >&2
		exit 1
	fi
	echo "| $a | $label | $shape | $mem B | $usec us | $(awk -v u="$busec" 'BEGIN { printf "%.2f", u / 8 }') us |"
	cli flushall >/dev/null
done
