#!/bin/sh
# `make run`: runs the daemon in the foreground with the given policy, first
# starting a local redis-server if nothing answers on the policy's Redis
# address. The Redis it started is stopped when the daemon exits.
set -eu
policy=${1:-conf/ratelimitd.yaml}
[ -r "$policy" ] || { echo "run: cannot read $policy" >&2; exit 1; }
# A policy with errors is reported before a Redis is started for nothing.
build/ratelimitd -t -c "$policy" >/dev/null || exit 1
# redis.address from the policy (host:port), in block or flow style
# (`redis: { address: host:port }`); unix sockets are left to the user.
addr=$(awk '
	/^redis:[ \t]*\{/ { f = 1 }
	f {
		if (match($0, /address:[ \t]*[^ \t,}]+/)) {
			v = substr($0, RSTART, RLENGTH); sub(/address:[ \t]*/, "", v)
			print v; exit
		}
		if (index($0, "}")) f = 0
		next
	}
	/^redis:/ { r = 1; next }
	/^[^ #]/ { r = 0 }
	r && $1 == "address:" { print $2; exit }' "$policy" | tr -d '"'"'")
addr=${addr:-127.0.0.1:6379}
host=${addr%:*}; port=${addr##*:}
# [::1]:6379: redis-cli and redis-server take the address without brackets.
host=${host#[}; host=${host%]}
redis_pid=""
redis_log=""
case "$addr" in
unix:*) ;;
*)
	if ! redis-cli -h "$host" -p "$port" ping >/dev/null 2>&1; then
		echo "run: no Redis on $addr; starting redis-server on port $port (data not saved)"
		# Its own session, so Ctrl-C reaches only the daemon, which drains
		# while Redis is still there; the EXIT trap stops Redis after.
		# Its log kept, to say why when it does not start (the port
		# taken by something that is not Redis, say).
		redis_log=$(mktemp "${TMPDIR:-/tmp}/ratelimitd-run-redis.XXXXXX")
		setsid redis-server --bind "$host" --port "$port" --save '' \
			--appendonly no --logfile "" >"$redis_log" 2>&1 &
		redis_pid=$!
		i=0
		until redis-cli -h "$host" -p "$port" ping >/dev/null 2>&1; do
			i=$((i + 1))
			if [ $i -gt 50 ] || ! kill -0 "$redis_pid" 2>/dev/null; then
				echo "run: redis-server did not start; its last words:" >&2
				tail -n 5 "$redis_log" >&2
				kill "$redis_pid" 2>/dev/null || true
				rm -f "$redis_log"
				exit 1
			fi
			sleep 0.1
		done
	fi ;;
esac
# Only the redis-server this script started, if it still runs: under set -e
# a failed kill as the last command of an && list would end the script with
# 1, and a PID of a Redis gone since may belong to another process by now.
cleanup() {
	if [ -n "$redis_pid" ] &&
	    [ "$(cat /proc/"$redis_pid"/comm 2>/dev/null)" = redis-server ]; then
		kill "$redis_pid" 2>/dev/null || true
	fi
	[ -z "$redis_log" ] || rm -f "$redis_log"
}
trap cleanup EXIT INT TERM
echo "run: build/ratelimitd -c $policy (Ctrl-C stops it)"
build/ratelimitd -c "$policy" &
daemon=$!
# Ctrl-C signals the whole foreground group, the daemon with it: passing it
# on would be a second signal, which cuts the drain short. A TERM sent to
# this script alone is passed on.
trap : INT
trap 'kill -TERM $daemon 2>/dev/null' TERM
# The daemon's own status (1 when it cannot start, say its port is taken),
# once it has exited: a wait cut short by Ctrl-C returns above 128 while
# the daemon still drains.
status=0
wait "$daemon" || status=$?
if [ "$status" -gt 128 ] && kill -0 "$daemon" 2>/dev/null; then
	status=0
	wait "$daemon" || status=$?
fi
exit "$status"
