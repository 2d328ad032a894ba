#!/usr/bin/env bash
# make bench: throughput, latency, CPU and memory of ratelimitd against its
# ceilings, all on 127.0.0.1.
#
# Builds build/ratelimitd and build/limits.lua with `make`, starts its own
# redis-server, nginx and daemon on free ports in a temporary directory, and
# drives them with wrk -t1 -c50 (and redis-benchmark -c50 -P1):
#
#   ceilings  redis  EVALSHA of build/limits.lua, fixed_window, 10,000 random keys
#             nginx  `return 204`, one process; and, for information, with
#                    as many worker processes as each server.workers > 1
#   daemon    fw     /check, fixed_window, X-Api-Key over 10,000 keys
#             tb     /check, token_bucket, 10,000 keys
#             three  /check, three limits on one route, 10,000 keys
#             hot    /check, one key far over its limit (every request denied),
#                    with the one-process nginx measured again just before
#                    and just after it: its ceiling from the same minute
#             fw2   fw again, to show whether RSS grows across runs
#             fw-single  fw on a second daemon with redis.max_batch: 1 (one
#                   script call per check), to show what batching buys
#   peer      fw     the fw load against a Node.js sidecar on
#                    rate-limiter-flexible (scripts/bench/peer/), with as
#                    many processes as server.workers, run between hot and
#                    fw2: a peer in another language, beside the same
#                    ceilings (needs node and npm; its packages are
#                    installed into build/bench-peer)
#   for each server.workers value in BENCH_WORKERS, and the checks per
#   EVALSHA during fw (Redis INFO commandstats against the daemon's counts).
#
# Each measured run follows a warm-up. CPU is from /proc/PID/stat
# (utime+stime) over the measured run, RSS from /proc/PID/status after it.
# Targets are reported PASS/FAIL for information; the exit status is non-zero
# only when something failed to run.
#
# Environment:
#   BENCH_DURATION  seconds per measured run (default 10)
#   BENCH_WARMUP    seconds of warm-up before each (default 2)
#   BENCH_WORKERS   server.workers values to measure (default "1 2")
#   BENCH_ONLY      all | ceilings | daemon (default all)
#   BENCH_NO_MAKE   1 = do not run make (use what is in build/)
#   BENCH_PEER      0 = do not measure the peer (default 1: measured when
#                   node and npm are there)
#   BENCH_KEEP      1 = keep the work directory (logs, configs) and print it
#   BENCH_OUT       also write the report (Markdown) to this file
#   RATELIMITD_BIN, RATELIMITD_LUA  binary and script to use
#                   (default build/ratelimitd, build/limits.lua)

set -uo pipefail
export LC_ALL=C

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
HERE="$ROOT/scripts/bench"
# shellcheck source=scripts/procs.sh
. "$ROOT/scripts/procs.sh"
BIN=${RATELIMITD_BIN:-$ROOT/build/ratelimitd}
LUA=${RATELIMITD_LUA:-$ROOT/build/limits.lua}
DURATION=${BENCH_DURATION:-10}
WARMUP=${BENCH_WARMUP:-2}
WORKERS_LIST=${BENCH_WORKERS:-1 2}
ONLY=${BENCH_ONLY:-all}
CONNS=50
NKEYS=10000
CLK_TCK=$(getconf CLK_TCK)

# Targets (issue 5).
T_FW_VS_REDIS=0.6       # fw req/s >= 0.6 x redis EVALSHA req/s
T_P99_MS=1.0            # p99 <= 1 ms at -c50
T_HOT_VS_NGINX=0.7      # hot req/s >= 0.7 x nginx req/s
T_RSS_KB=16384          # RSS <= 16 MB after the runs
T_RSS_GROWTH_KB=512     # fw2 RSS - highest RSS before it <= this ("no growth")

WORK=
PIDS=()
ERRORS=0

say() { printf '[bench %s] %s\n' "$(date +%T)" "$*" >&2; }
die() { say "error: $*"; exit 1; }
err() { say "error: $*"; ERRORS=$((ERRORS + 1)); }

cleanup() {
	stop_started
	if [[ -n $WORK && -d $WORK ]]; then
		if [[ ${BENCH_KEEP:-0} == 1 ]]; then
			say "work directory kept: $WORK"
		else
			rm -rf -- "$WORK"
		fi
	fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Stops one process we started: TERM, up to $2 s, then KILL. Sets STOP_RC.
stop_pid() {
	local pid=$1 limit=${2:-5} i
	STOP_RC=
	[[ -n $pid ]] || return 0
	kill -TERM "$pid" 2>/dev/null
	for ((i = 0; i < limit * 10; i++)); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.1
	done
	if kill -0 "$pid" 2>/dev/null; then
		kill -KILL "$pid" 2>/dev/null
		wait "$pid" 2>/dev/null
		STOP_RC=killed
	else
		wait "$pid" 2>/dev/null
		STOP_RC=$?
	fi
	forget_pid "$pid"
}

# answers PID URL CODE TRIES: 0 once URL answers CODE, 1 when PID has
# exited or TRIES tries 50 ms apart have passed.
answers() {
	local i
	for ((i = 0; i < $4; i++)); do
		kill -0 "$1" 2>/dev/null || return 1
		[[ $(curl -s -o /dev/null -w '%{http_code}' "$2" 2>/dev/null) == "$3" ]] && return 0
		sleep 0.05
	done
	return 1
}

# with_children PID: REPLY = PID and its child processes (a master's
# workers), comma-separated, as measure samples them.
with_children() {
	local kids
	REPLY=$1
	kids=$(cat "/proc/$1/task/"*/children 2>/dev/null)
	[[ -z $kids ]] || REPLY+=",$(echo $kids | tr ' ' ',')"
}

# ---- /proc sampling --------------------------------------------------------

# cpu_ticks PID: REPLY = utime+stime of the whole process, in clock ticks.
# An empty PID reads as 0; a vanished one fails.
# cpu_ticks PID[,PID...]: utime+stime summed over the processes.
cpu_ticks() {
	local line pid sum=0
	REPLY=0
	[[ -n $1 ]] || return 0
	for pid in ${1//,/ }; do
		{ read -r line <"/proc/$pid/stat"; } 2>/dev/null || return 1
		line=${line##*) }
		local -a f=($line)
		sum=$((sum + f[11] + f[12]))
	done
	REPLY=$sum
}

rss_kb() {
	awk '/^VmRSS:/ { print $2; found = 1 } END { if (!found) print "?" }' "/proc/$1/status" 2>/dev/null || echo "?"
}

# sample SRV RDS GEN: S_T (s, float), S_SRV, S_RDS, S_GEN (ticks).
sample() {
	local t=$EPOCHREALTIME
	cpu_ticks "$1" || return 1
	local a=$REPLY
	cpu_ticks "$2" || return 1
	local b=$REPLY
	cpu_ticks "$3" || return 1
	S_T=$t S_SRV=$a S_RDS=$b S_GEN=$REPLY
}

pct() { # ticks seconds -> CPU % of one core
	awk -v t="$1" -v s="$2" -v hz="$CLK_TCK" 'BEGIN { if (s <= 0) print "n/a"; else printf "%.0f", 100 * t / hz / s }'
}

# measure SRV_PID RDS_PID OUT cmd...: runs the load generator cmd in the
# background (stdout+stderr to OUT) and samples the CPU of the server, Redis
# and the load generator from 0.5 s after its start until it exits. Sets
# M_SRV, M_RDS, M_GEN (CPU %, 100 = one core) and returns cmd's exit status.
measure() {
	local srv=$1 rds=$2 out=$3
	shift 3
	"$@" >"$out" 2>&1 &
	local gen=$!
	PIDS+=("$gen")
	sleep 0.5
	local t0= s0 r0 g0 t1= s1 r1 g1
	if sample "$srv" "$rds" "$gen"; then
		t0=$S_T s0=$S_SRV r0=$S_RDS g0=$S_GEN
		while kill -0 "$gen" 2>/dev/null; do
			sleep 0.25
			if sample "$srv" "$rds" "$gen"; then
				t1=$S_T s1=$S_SRV r1=$S_RDS g1=$S_GEN
			fi
		done
	fi
	wait "$gen"
	local rc=$?
	forget_pid "$gen"
	M_SRV=n/a M_RDS=n/a M_GEN=n/a
	if [[ -n $t0 && -n $t1 ]]; then
		local secs
		secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')
		M_SRV=$(pct $((s1 - s0)) "$secs")
		M_RDS=$(pct $((r1 - r0)) "$secs")
		M_GEN=$(pct $((g1 - g0)) "$secs")
		[[ -n $srv ]] || M_SRV=-
		[[ -n $rds ]] || M_RDS=-
	fi
	return $rc
}

# ---- output parsing --------------------------------------------------------

# parse_wrk FILE: W_RPS W_P50 W_P99 (ms) W_TOTAL W_NON2XX W_SOCKERR
parse_wrk() {
	local v
	v=$(awk '
		function ms(x,   n, u) {
			n = x + 0; u = x; sub(/^[0-9.]+/, "", u)
			if (u == "us") return n / 1000
			if (u == "ms") return n
			if (u == "s") return n * 1000
			if (u == "m") return n * 60000
			if (u == "h") return n * 3600000
			return -1
		}
		/^ +50% / { p50 = ms($2) }
		/^ +99% / { p99 = ms($2) }
		/ requests in / { total = $1 }
		/Non-2xx or 3xx responses:/ { non2xx = $NF }
		/Socket errors:/ { sub(/.*Socket errors: */, ""); gsub(/ /, ""); sockerr = $0 }
		/^Requests\/sec:/ { rps = $2 }
		END {
			if (rps == "") exit 1
			printf "%.0f %.3f %.3f %d %d %s\n", rps, p50, p99, total, non2xx + 0, (sockerr == "" ? "none" : sockerr)
		}' "$1") || return 1
	read -r W_RPS W_P50 W_P99 W_TOTAL W_NON2XX W_SOCKERR <<<"$v"
}

# parse_rb FILE: B_RPS B_P50 B_P99 (ms) from redis-benchmark --csv.
parse_rb() {
	local v
	v=$(awk -F'","' '/^"EVALSHA/ { printf "%.0f %.3f %.3f\n", $2, $5, $7; found = 1 } END { if (!found) exit 1 }' "$1") || return 1
	read -r B_RPS B_P50 B_P99 <<<"$v"
}

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b + 0 <= 0 || a == "") print "n/a"; else printf "%.2f", a / b }'; }
ge() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a != "n/a" && a + 0 >= b + 0) }'; }
le() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a != "n/a" && a + 0 <= b + 0) }'; }
verdict() { if "$@"; then echo PASS; else echo FAIL; fi; }
mb() { awk -v k="$1" 'BEGIN { if (k == "?") print "?"; else printf "%.1f", k / 1024 }'; }

# ---- processes -------------------------------------------------------------

REDIS_PID= REDIS_PORT=
start_redis() {
	REDIS_PORT=$(free_port)
	redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no \
		--dir "$WORK" --logfile "$WORK/redis.log" >/dev/null 2>&1 &
	REDIS_PID=$!
	PIDS+=("$REDIS_PID")
	local i
	for ((i = 0; i < 100; i++)); do
		[[ $(rcli PING 2>/dev/null) == PONG ]] && return 0
		sleep 0.05
	done
	die "redis-server did not start (see $WORK/redis.log)"
}
rcli() { redis-cli -p "$REDIS_PORT" "$@"; }

# EVALSHA calls Redis has run (INFO commandstats), 0 before the first.
evalsha_calls() {
	local v
	v=$(rcli INFO commandstats | tr -d '\r' | sed -n 's/^cmdstat_evalsha:calls=\([0-9]*\),.*/\1/p')
	echo "${v:-0}"
}

# Checks the daemon has answered on route fw (all results).
fw_checks() {
	curl -s "$DAEMON_URL/metrics" 2>/dev/null |
		awk '/^ratelimitd_checks_total\{/ && /route="fw"/ { n += $NF } END { printf "%d\n", n }'
}

WRK_ARGS=(-t1 -c"$CONNS" --latency)

# wrk_cmd KIND URL URI DURATION: WRK_CMD = the wrk command line. KIND keys:
# X-Api-Key over NKEYS keys (scripts/bench/keys.lua); one: one fixed key, a
# static request without Lua. (An array, not a function, so that the PID of
# a background run is wrk's own.)
wrk_cmd() {
	WRK_CMD=(wrk "${WRK_ARGS[@]}" -d"$4"s)
	if [[ $1 == keys ]]; then
		WRK_CMD+=(-s "$HERE/keys.lua" "$2" -- "$3" "$NKEYS")
	else
		WRK_CMD+=(-H "X-Api-Key: bench-hot-key" -H "X-Original-URI: $3" "$2")
	fi
}

# ---- report ----------------------------------------------------------------

ROWS=()     # Markdown table rows
TARGETS=()  # target lines
NOTES=()    # anything odd
row() { ROWS+=("| $* |"); }
note() { NOTES+=("$*"); say "note: $*"; }

# ---- ceilings ---------------------------------------------------------------

REDIS_RPS= NGINX_RPS= REDIS_P99= NGINX_P99=
NGINX1_PID= NGINX1_URL=
declare -A NGINX_N_RPS=() NGINX_N_P99=()   # by worker processes, for N > 1

ceiling_redis() {
	local sha key n
	sha=$(rcli -x SCRIPT LOAD <"$LUA") || { err "SCRIPT LOAD failed"; return; }
	[[ $sha =~ ^[0-9a-f]{40}$ ]] || { err "SCRIPT LOAD answered: $sha"; return; }
	SCRIPT_SHA=$sha
	# The daemon's call for one check on route fw: the time (0: Redis TIME),
	# one limit set (one fixed_window limit of 1000000 per 1h), then the
	# check, of set 1 at cost 1.
	key='rl:{fw:__rand_int__}:fixed_window:fixed_window'
	local -a cmd=(EVALSHA "$sha" 1 "$key" 0 1 1 fixed_window 1000000 3600000000 0 1 1)
	local reply
	reply=$(rcli EVALSHA "$sha" 1 'rl:{fw:probe}:fixed_window:fixed_window' 0 1 1 fixed_window 1000000 3600000000 0 1 1 | head -1)
	[[ $reply == 1 ]] || { err "EVALSHA probe did not allow: $reply"; return; }

	# redis-benchmark runs a request count, not a duration: warm up in
	# chunks for WARMUP seconds, then size the measured run from the last
	# chunk's rate.
	say "ceiling: redis-benchmark EVALSHA (warm-up ${WARMUP}s)"
	local end=$((SECONDS + WARMUP))
	while :; do
		redis-benchmark -p "$REDIS_PORT" -c "$CONNS" -P 1 -r "$NKEYS" -n 20000 --csv "${cmd[@]}" \
			>"$WORK/rb-warmup.out" 2>&1 || { err "redis-benchmark failed: $(tail -3 "$WORK/rb-warmup.out")"; return; }
		parse_rb "$WORK/rb-warmup.out" || { err "cannot parse redis-benchmark output"; return; }
		((SECONDS < end)) || break
	done
	n=$(awk -v r="$B_RPS" -v d="$DURATION" 'BEGIN { n = int(r * d); if (n < 10000) n = 10000; print n }')
	say "ceiling: redis-benchmark EVALSHA -n $n (~${DURATION}s)"
	if ! measure "" "$REDIS_PID" "$WORK/rb.out" \
		redis-benchmark -p "$REDIS_PORT" -c "$CONNS" -P 1 -r "$NKEYS" -n "$n" --csv "${cmd[@]}"; then
		err "redis-benchmark failed: $(tail -3 "$WORK/rb.out")"
		return
	fi
	parse_rb "$WORK/rb.out" || { err "cannot parse redis-benchmark output"; return; }
	REDIS_RPS=$B_RPS
	REDIS_P99=$B_P99
	local nk
	nk=$(rcli --scan --pattern 'rl:{fw:*' | wc -l)
	row "ceiling: redis EVALSHA fixed_window, redis-benchmark -c$CONNS -P1 -r$NKEYS | - | $B_RPS | $B_P50 | $B_P99 | - | $M_RDS | $M_GEN | 1.00"
	say "  redis: $B_RPS req/s, p50 $B_P50 ms, p99 $B_P99 ms, $nk keys"
	((nk >= NKEYS / 2)) || note "redis-benchmark touched only $nk keys (expected ~$NKEYS): __rand_int__ not expanded?"
	rcli FLUSHALL >/dev/null
}

ceiling_nginx() { # worker processes (1: the ceiling, one process)
	local n=${1:-1}
	local port dir=$WORK/nginx-$n master=off
	((n > 1)) && master=on
	port=$(free_port)
	mkdir -p "$dir/nginx-tmp"
	sed -e "s|@DIR@|$dir|g" -e "s|@PORT@|$port|g" -e "s|@MASTER@|$master|" \
		-e "s|@WORKERS@|$n|" "$HERE/nginx.conf.in" >"$dir/nginx.conf"
	nginx -p "$dir" -e "$dir/nginx-error.log" -c "$dir/nginx.conf" -g 'daemon off;' \
		>"$dir/nginx.out" 2>&1 &
	local pid=$!
	PIDS+=("$pid")
	if ! answers "$pid" "http://127.0.0.1:$port/check" 204 100; then
		err "nginx ($n process(es)) did not start: $(cat "$dir/nginx.out" "$dir/nginx-error.log" 2>/dev/null | tail -3)"
		stop_pid "$pid"
		return
	fi
	# Under a master the workers do the serving: measure them all.
	local pids
	with_children "$pid"
	pids=$REPLY
	local url=http://127.0.0.1:$port/check what="nginx return 204"
	((n > 1)) && what="nginx return 204, $n worker processes"
	say "ceiling: $what (warm-up ${WARMUP}s, run ${DURATION}s)"
	if wrk_nginx "$pids" "$url" "$WORK/nginx-$n"; then
		if ((n == 1)); then
			NGINX_RPS=$W_RPS
			NGINX_P99=$W_P99
			row "ceiling: $what (server CPU = nginx) | - | $W_RPS | $W_P50 | $W_P99 | $M_SRV | - | $M_GEN | 1.00"
		else
			NGINX_N_RPS[$n]=$W_RPS
			NGINX_N_P99[$n]=$W_P99
			row "(information) $what (server CPU = nginx, all processes) | ($n) | $W_RPS | $W_P50 | $W_P99 | $M_SRV | - | $M_GEN | $(ratio "$W_RPS" "$NGINX_RPS") (nginx)"
		fi
		say "  $what: $W_RPS req/s, p50 $W_P50 ms, p99 $W_P99 ms"
		[[ $W_SOCKERR == none ]] || note "$what run: socket errors $W_SOCKERR"
	else
		err "wrk against $what failed: $(tail -3 "$WORK/nginx-$n.out")"
	fi
	if ((n == 1)) && [[ -n $NGINX_RPS ]]; then
		# Kept running, idle, to be measured again beside the hot scenario.
		NGINX1_PID=$pid NGINX1_URL=$url
	else
		stop_pid "$pid"
	fi
}

# wrk_nginx PIDS URL OUT: warm-up and a measured run of wrk against nginx,
# into W_* (parse_wrk) and M_* (measure).
wrk_nginx() {
	wrk_cmd one "$2" /hot/x "$WARMUP"
	"${WRK_CMD[@]}" >"$3-warmup.out" 2>&1
	wrk_cmd one "$2" /hot/x "$DURATION"
	measure "$1" "" "$3.out" "${WRK_CMD[@]}" && parse_wrk "$3.out"
}

# nginx_beside TAG: the one-process nginx ceiling measured again, now, so
# that the hot scenario has a ceiling from the same minute as itself; the
# first measurement is minutes older, and this machine's speed drifts by a
# third over minutes. Appends to BESIDE_RPS.
nginx_beside() {
	[[ -n $NGINX1_PID ]] || return 0
	say "ceiling again, $1: nginx return 204 (warm-up ${WARMUP}s, run ${DURATION}s)"
	if wrk_nginx "$NGINX1_PID" "$NGINX1_URL" "$WORK/nginx-$1"; then
		BESIDE_RPS+=("$W_RPS")
		row "ceiling again, $1 (nginx return 204, server CPU = nginx) | - | $W_RPS | $W_P50 | $W_P99 | $M_SRV | - | $M_GEN | $(ratio "$W_RPS" "$NGINX_RPS") (nginx)"
		say "  nginx again: $W_RPS req/s, p50 $W_P50 ms, p99 $W_P99 ms"
	else
		err "wrk against nginx ($1) failed: $(tail -3 "$WORK/nginx-$1.out")"
	fi
}

# ---- daemon -----------------------------------------------------------------

DAEMON_PID= DAEMON_PORT= DAEMON_URL=

third_limit() {
	# gcra when both the validator and the built script know it; otherwise
	# a second fixed_window, so the route still has three limits.
	local probe=$WORK/probe.yaml
	sed -e "s|@PORT@|1|; s|@REDIS_PORT@|1|; s|@WORKERS@|1|" \
		-e 's|@THIRD_LIMIT@|{ name: smooth, algorithm: gcra, rate: "100000/s", burst: 1000000 }|' \
		"$HERE/policy.yaml.in" >"$probe"
	if "$BIN" -t -c "$probe" >/dev/null 2>"$WORK/probe.err" && grep -q 'ALGORITHMS.gcra' "$LUA"; then
		THIRD='{ name: smooth, algorithm: gcra, rate: "100000/s", burst: 1000000 }'
		THIRD_DESC="fixed_window + token_bucket + gcra"
	else
		THIRD='{ name: minute, algorithm: fixed_window, limit: 1000000, window: 1m }'
		THIRD_DESC="fixed_window + token_bucket + fixed_window (gcra not available)"
		note "gcra not accepted/built; three = $THIRD_DESC ($(head -1 "$WORK/probe.err"))"
	fi
}

start_daemon() { # workers [max_batch]
	DAEMON_PORT=$(free_port)
	DAEMON_URL=http://127.0.0.1:$DAEMON_PORT
	local policy=$WORK/policy-w$1${2:+-b$2}.yaml
	sed -e "s|@PORT@|$DAEMON_PORT|; s|@REDIS_PORT@|$REDIS_PORT|; s|@WORKERS@|$1|" \
		-e "s|@THIRD_LIMIT@|$THIRD|" "$HERE/policy.yaml.in" >"$policy"
	[[ -z ${2:-} ]] || sed -i "s|^redis:|redis:\n  max_batch: $2|" "$policy"
	if ! "$BIN" -t -c "$policy" >"$WORK/validate.out" 2>&1; then
		err "policy refused by ratelimitd -t: $(head -5 "$WORK/validate.out")"
		return 1
	fi
	DAEMON_LOG=$WORK/daemon-w$1${2:+-b$2}.log
	"$BIN" -c "$policy" >"$DAEMON_LOG" 2>&1 &
	DAEMON_PID=$!
	PIDS+=("$DAEMON_PID")
	answers "$DAEMON_PID" "$DAEMON_URL/readyz" 200 200 && return 0
	err "daemon (workers=$1) not ready within 10 s: $(tail -5 "$DAEMON_LOG")"
	stop_pid "$DAEMON_PID"
	return 1
}

# probe URI KEY: PROBE_CODE and PROBE_REMAINING of one /check.
probe() {
	local h
	h=$(curl -s -D - -o /dev/null -H "X-Original-URI: $1" -H "X-Api-Key: $2" "$DAEMON_URL/check" 2>/dev/null | tr -d '\r')
	PROBE_CODE=$(awk 'NR == 1 { print $2 }' <<<"$h")
	PROBE_REMAINING=$(awk -F': *' 'tolower($1) == "x-ratelimit-remaining" { print $2 }' <<<"$h")
}

# metrics_snapshot FILE: the daemon's counters that say a reply did not come
# from the limits script: checks by result failed_open, failed_closed,
# no_route, and Redis errors by kind. Such replies are cheap and would
# flatter req/s.
metrics_snapshot() {
	curl -s "$DAEMON_URL/metrics" 2>/dev/null |
		awk '/^ratelimitd_checks_total\{/ && /result="(failed_open|failed_closed|no_route)"/ {
			r = $0; sub(/.*result="/, "", r); sub(/".*/, "", r); s[r] += $NF }
		/^ratelimitd_redis_errors_total\{/ {
			k = $0; sub(/.*kind="/, "", k); sub(/".*/, "", k); s["redis_" k] += $NF }
		END { for (k in s) print k, s[k] }' | sort >"$1"
}

# metrics_delta BEFORE AFTER: "name +N ..." for the counters that moved.
metrics_delta() {
	join -a 2 -e 0 -o 0,1.2,2.2 "$1" "$2" | awk '$3 - $2 != 0 { printf "%s%s +%d", sep, $1, $3 - $2; sep = ", " }'
}

# scenario NAME URI KIND(keys|one) WORKERS: warm-up, measured run, row.
scenario() {
	local name=$1 uri=$2 kind=$3 w=$4 out
	out=$WORK/w$w-$name.out
	if [[ $kind == keys ]]; then
		probe "$uri" bench-probe
		if [[ $PROBE_CODE != 200 || $PROBE_REMAINING == -1 || -z $PROBE_REMAINING ]]; then
			note "workers=$w $name: probe /check got status ${PROBE_CODE:-none}, X-RateLimit-Remaining '${PROBE_REMAINING}' (expected 200 and a count)"
		fi
	fi
	metrics_snapshot "$WORK/m0"
	say "daemon workers=$w: $name (warm-up ${WARMUP}s, run ${DURATION}s)"
	wrk_cmd "$kind" "$DAEMON_URL/check" "$uri" "$WARMUP"
	"${WRK_CMD[@]}" >"$WORK/w$w-$name-warmup.out" 2>&1
	if [[ $kind == one ]]; then
		probe "$uri" bench-hot-key
		[[ $PROBE_CODE == 429 ]] ||
			note "workers=$w $name: after warm-up the hot key got ${PROBE_CODE:-no answer}, expected 429"
	fi
	metrics_snapshot "$WORK/m1"
	if ! kill -0 "$DAEMON_PID" 2>/dev/null; then
		err "daemon (workers=$w) died during $name warm-up: $(tail -5 "$DAEMON_LOG")"
		return 1
	fi
	wrk_cmd "$kind" "$DAEMON_URL/check" "$uri" "$DURATION"
	if ! measure "$DAEMON_PID" "$REDIS_PID" "$out" "${WRK_CMD[@]}" || ! parse_wrk "$out"; then
		err "wrk $name (workers=$w) failed: $(tail -3 "$out")"
		return 1
	fi
	if ! kill -0 "$DAEMON_PID" 2>/dev/null; then
		err "daemon (workers=$w) died during $name: $(tail -5 "$DAEMON_LOG")"
		return 1
	fi
	local rss ratio vs
	rss=$(rss_kb "$DAEMON_PID")
	RSS_SERIES+=("$name $(mb "$rss")")
	RSS_KB[$name]=$rss
	metrics_snapshot "$WORK/m2"
	local moved_warm moved
	moved_warm=$(metrics_delta "$WORK/m0" "$WORK/m1")
	moved=$(metrics_delta "$WORK/m1" "$WORK/m2")
	if [[ $kind == one ]]; then
		ratio=$(ratio "$W_RPS" "$NGINX_RPS") vs=nginx
		((W_NON2XX * 100 >= W_TOTAL * 99)) ||
			note "workers=$w $name: only $W_NON2XX of $W_TOTAL replies were denials"
	else
		ratio=$(ratio "$W_RPS" "$REDIS_RPS") vs=redis
		((W_NON2XX == 0)) || note "workers=$w $name: $W_NON2XX of $W_TOTAL replies were not 2xx (expected all allowed)"
	fi
	[[ $W_SOCKERR == none ]] || note "workers=$w $name: wrk socket errors $W_SOCKERR"
	[[ -z $moved_warm ]] || note "workers=$w $name warm-up: $moved_warm (from /metrics)"
	[[ -z $moved ]] || note "workers=$w $name measured run: $moved (from /metrics; these replies did not run the limits, req/s counts them)"
	row "$name | $w | $W_RPS | $W_P50 | $W_P99 | $M_SRV | $M_RDS | $M_GEN | $ratio ($vs)"
	say "  $name: $W_RPS req/s, p50 $W_P50 ms, p99 $W_P99 ms, daemon CPU $M_SRV%, RSS $(mb "$rss") MB"
	RPS[$name]=$W_RPS
	P99[$name]=$W_P99
}

bench_daemon() { # workers
	local w=$1
	rcli FLUSHALL >/dev/null
	rcli SCRIPT FLUSH >/dev/null
	local sha
	sha=$(sha1sum <"$LUA" | cut -d' ' -f1)
	start_daemon "$w" || return
	local -A RSS_KB=() RPS=() P99=()
	local -a RSS_SERIES=("start $(mb "$(rss_kb "$DAEMON_PID")")")
	local s ok=1 calls0 calls1 checks0 checks1
	calls0=$(evalsha_calls) checks0=$(fw_checks)
	scenario fw /fw/x keys "$w" || ok=0
	calls1=$(evalsha_calls) checks1=$(fw_checks)
	# Checks per script call over fw's warm-up and run, both counted by
	# their own side: the daemon's checks, Redis's EVALSHA calls.
	if ((ok)) && ((calls1 > calls0)); then
		BATCH_LINES+=("workers=$w fw: $(awk -v c=$((calls1 - calls0)) -v n=$((checks1 - checks0)) \
			'BEGIN { printf "%.1f", n / c }') checks per EVALSHA on average (redis.max_batch 64; Redis INFO commandstats vs the daemon's checks_total)")
	fi
	if [[ $(rcli SCRIPT EXISTS "$sha" | head -1) != 1 ]]; then
		note "workers=$w: the daemon did not load $LUA byte for byte (sha1 $sha not in Redis's script cache)"
	fi
	local nk
	nk=$(rcli --scan --pattern 'rl:{fw:*' | wc -l)
	((nk >= NKEYS * 9 / 10)) || note "workers=$w fw: $nk keys rl:{fw:*} in Redis after the run (expected ~$NKEYS)"
	((ok)) && { scenario tb /tb/x keys "$w" || ok=0; }
	((ok)) && { scenario three /three/x keys "$w" || ok=0; }
	# hot is measured against nginx run just before and just after it.
	local -a BESIDE_RPS=()
	((ok)) && nginx_beside "before hot, workers=$w"
	((ok)) && { scenario hot /hot/x one "$w" || ok=0; }
	((ok)) && nginx_beside "after hot, workers=$w"
	local PEER_RPS= PEER_P99=
	((ok)) && bench_peer "$w"
	((ok)) && { scenario fw2 /fw/x keys "$w" || ok=0; }
	if [[ -n $PEER_RPS && -n ${RPS[fw2]:-} ]]; then
		PEER_LINES+=("workers=$w fw2 (run right after the peer) vs the peer with $w process(es): $(ratio "${RPS[fw2]}" "$PEER_RPS") x its req/s (fw2 ${RPS[fw2]}, peer $PEER_RPS; x redis EVALSHA: $(ratio "${RPS[fw2]}" "$REDIS_RPS") vs $(ratio "$PEER_RPS" "$REDIS_RPS"); fw, minutes earlier, $(ratio "${RPS[fw]}" "$PEER_RPS") x; p99 fw2 ${P99[fw2]} vs $PEER_P99 ms)")
	fi

	if ((ok)); then
		TARGETS+=("workers=$w fw >= $T_FW_VS_REDIS x redis EVALSHA: $(ratio "${RPS[fw]}" "$REDIS_RPS") -> $(verdict ge "$(ratio "${RPS[fw]}" "$REDIS_RPS")" "$T_FW_VS_REDIS")")
		# Beside each, the p99 of the ceiling the scenario is measured
		# against, at the same concurrency: what its server alone gives.
		for s in fw tb three hot fw2; do
			local ceil="redis EVALSHA ${REDIS_P99:-n/a}"
			if [[ $s == hot ]]; then
				ceil="nginx ${NGINX_P99:-n/a}"
				((w > 1)) && ceil+=" ms; nginx with $w worker processes ${NGINX_N_P99[$w]:-n/a}"
			fi
			TARGETS+=("workers=$w $s p99 <= $T_P99_MS ms: ${P99[$s]} ms (ceiling: $ceil ms) -> $(verdict le "${P99[$s]}" "$T_P99_MS")")
		done
		local beside=
		((w > 1)) && beside=" (nginx with $w worker processes: $(ratio "${NGINX_N_RPS[$w]:-}" "$NGINX_RPS") x nginx)"
		TARGETS+=("workers=$w hot >= $T_HOT_VS_NGINX x nginx: $(ratio "${RPS[hot]}" "$NGINX_RPS") -> $(verdict ge "$(ratio "${RPS[hot]}" "$NGINX_RPS")" "$T_HOT_VS_NGINX")$beside")
		if ((${#BESIDE_RPS[@]} == 2)); then
			local near
			near=$(awk -v a="${BESIDE_RPS[0]}" -v b="${BESIDE_RPS[1]}" 'BEGIN { printf "%.0f", (a + b) / 2 }')
			TARGETS+=("workers=$w hot >= $T_HOT_VS_NGINX x nginx measured beside it (mean of ${BESIDE_RPS[0]} before and ${BESIDE_RPS[1]} after): $(ratio "${RPS[hot]}" "$near") -> $(verdict ge "$(ratio "${RPS[hot]}" "$near")" "$T_HOT_VS_NGINX")")
		fi
		local max=0 k
		for k in "${RSS_KB[@]}"; do
			if [[ $k != "?" ]] && ((k > max)); then max=$k; fi
		done
		TARGETS+=("workers=$w RSS <= 16 MB: max $(mb "$max") MB -> $(verdict le "$max" "$T_RSS_KB")")
		# Growth = what repeating a workload adds once every workload has
		# run: fw2 against the highest RSS before it. (fw -> fw2 also
		# counts the buffers and malloc arenas that tb, three and hot warm
		# up on the way; both are printed.)
		local g=n/a g0=n/a before=0
		local r1=${RSS_KB[fw]} r2=${RSS_KB[fw2]}
		for s in fw tb three hot; do
			k=${RSS_KB[$s]:-?}
			if [[ $k != "?" ]] && ((k > before)); then before=$k; fi
		done
		if [[ $r2 != "?" ]] && ((before > 0)); then g=$((r2 - before)); fi
		if [[ $r1 != "?" && $r2 != "?" ]]; then g0=$((r2 - r1)); fi
		TARGETS+=("workers=$w RSS growth when fw runs again (fw2 - highest RSS before it) <= $T_RSS_GROWTH_KB kB: $g kB -> $(verdict le "$g" "$T_RSS_GROWTH_KB") (fw -> fw2: $g0 kB)")
	fi
	RSS_LINES+=("workers=$w daemon RSS (MB) after each run: $(IFS=,; echo "${RSS_SERIES[*]}" | sed 's/,/, /g')")

	stop_pid "$DAEMON_PID" 10
	if [[ $STOP_RC != 0 ]]; then
		note "workers=$w: daemon exit status on SIGTERM: $STOP_RC (expected 0)"
	fi
	check_daemon_log "$w"

	# The same fw load with batching off (one script call per check), to
	# show what batching buys in this same run.
	if ((ok)) && start_daemon "$w" 1; then
		scenario fw-single /fw/x keys "$w" || ok=0
		if ((ok)); then
			# fw and fw2 are two runs of the same batched load; their mean
			# is steadier than either against this machine's noise.
			local both
			both=$(awk -v a="${RPS[fw]}" -v b="${RPS[fw2]:-${RPS[fw]}}" 'BEGIN { printf "%.0f", (a + b) / 2 }')
			TARGETS+=("workers=$w batching: fw/fw2 mean $(ratio "$both" "$REDIS_RPS") (fw $(ratio "${RPS[fw]}" "$REDIS_RPS"), fw2 $(ratio "${RPS[fw2]:-0}" "$REDIS_RPS")) vs fw-single $(ratio "${RPS[fw-single]}" "$REDIS_RPS") x redis EVALSHA (p99 ${P99[fw]} / ${P99[fw2]:-n/a} vs ${P99[fw-single]} ms)")
		fi
		stop_pid "$DAEMON_PID" 10
		check_daemon_log "$w"
	fi
}

# ---- peer ---------------------------------------------------------------

PEER_DIR=

# setup_peer: PEER_DIR = the peer's directory with its packages installed
# (npm ci from the committed lock, once per change of it), or empty with a
# note saying why the peer is not measured. The peer is a comparison, not
# the daemon: nothing about it fails the bench.
setup_peer() {
	if [[ ${BENCH_PEER:-1} == 0 ]]; then
		note "peer not measured: BENCH_PEER=0"
		return 0
	fi
	if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
		note "peer not measured: node and npm not found (Debian: apt-get install nodejs npm)"
		return 0
	fi
	local src=$HERE/peer dir=$ROOT/build/bench-peer
	mkdir -p "$dir"
	# installed.lock is written only once npm ci has finished, so an
	# install cut short (Ctrl-C, no network) is done again next time.
	if ! cmp -s "$src/package-lock.json" "$dir/installed.lock"; then
		say "peer: npm ci into $dir"
		rm -f "$dir/installed.lock"
		cp "$src/package.json" "$src/package-lock.json" "$dir/"
		if ! (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error) >"$WORK/npm.out" 2>&1; then
			note "peer not measured: npm ci failed: $(tail -3 "$WORK/npm.out" | tr '\n' ' ')"
			return 0
		fi
		cp "$src/package-lock.json" "$dir/installed.lock"
	fi
	cp "$src/server.js" "$dir/"
	PEER_DIR=$dir
}

# bench_peer PROCESSES: the fw load against the peer, into PEER_RPS and
# PEER_P99 and a row. Run between hot and fw2, so that fw2 is measured
# right after it, on the same minute of this machine.
bench_peer() {
	local w=$1 port url pid pids out=$WORK/peer-w$1
	PEER_RPS= PEER_P99=
	[[ -n $PEER_DIR ]] || return 0
	port=$(free_port)
	url=http://127.0.0.1:$port
	node "$PEER_DIR/server.js" "$port" "$REDIS_PORT" "$w" >"$out.log" 2>&1 &
	pid=$!
	PIDS+=("$pid")
	if ! answers "$pid" "$url/readyz" 200 200; then
		note "peer not measured ($w process(es)): not ready within 10 s: $(tail -3 "$out.log" | tr '\n' ' ')"
		stop_pid "$pid"
		return 0
	fi
	with_children "$pid"
	pids=$REPLY
	say "peer, $w process(es): fw (warm-up ${WARMUP}s, run ${DURATION}s)"
	wrk_cmd keys "$url/check" /fw/x "$WARMUP"
	"${WRK_CMD[@]}" >"$out-warmup.out" 2>&1
	wrk_cmd keys "$url/check" /fw/x "$DURATION"
	if measure "$pids" "$REDIS_PID" "$out.out" "${WRK_CMD[@]}" && parse_wrk "$out.out"; then
		((W_NON2XX == 0)) || note "peer ($w): $W_NON2XX of $W_TOTAL replies were not 2xx (expected all allowed)"
		[[ $W_SOCKERR == none ]] || note "peer ($w): wrk socket errors $W_SOCKERR"
		row "peer fw: Node.js rate-limiter-flexible, $w process(es) (server CPU = node, all processes) | ($w) | $W_RPS | $W_P50 | $W_P99 | $M_SRV | $M_RDS | $M_GEN | $(ratio "$W_RPS" "$REDIS_RPS") (redis)"
		say "  peer: $W_RPS req/s, p50 $W_P50 ms, p99 $W_P99 ms, CPU $M_SRV%"
		PEER_RPS=$W_RPS PEER_P99=$W_P99
	else
		note "peer not measured ($w process(es)): wrk failed: $(tail -3 "$out.out" | tr '\n' ' ')"
	fi
	stop_pid "$pid"
	[[ $STOP_RC == 0 ]] || note "peer ($w): exit status on SIGTERM: $STOP_RC (a worker process died?)"
	# It fails open with a 200 when Redis errs, which would flatter its
	# req/s: anything it logged is worth a look.
	[[ ! -s $out.log ]] || note "peer ($w) logged: $(sort "$out.log" | uniq -c | sort -rn | head -3 | tr '\n' ';')"
	# Its keys: counted (it did count every key), then removed. redis-cli
	# 7.0 has no --count for --scan: its default batch of 10 takes a
	# fraction of a second for the peer's 10,000 keys.
	local nk
	rcli --scan --pattern 'peer:fw:*' >"$out.keys"
	nk=$(wc -l <"$out.keys")
	[[ -z $PEER_RPS ]] || ((nk >= NKEYS * 9 / 10)) ||
		note "peer ($w): $nk keys peer:fw:* in Redis after the run (expected ~$NKEYS)"
	xargs -r -n 1000 redis-cli -p "$REDIS_PORT" UNLINK <"$out.keys" >/dev/null
}

check_daemon_log() { # workers
	local w=$1
	if grep -qiE 'error|fatal|assert|sanitizer' "$DAEMON_LOG"; then
		note "workers=$w: daemon log has errors: $(grep -iE 'error|fatal|assert|sanitizer' "$DAEMON_LOG" | sort | uniq -c | sort -rn | head -3 | tr '\n' ';')"
	fi
}

# ---- main -------------------------------------------------------------------

main() {
	case $ONLY in all | ceilings | daemon) ;; *) die "BENCH_ONLY must be all, ceilings or daemon" ;; esac
	need wrk wrk
	need redis-server redis-server
	need redis-cli redis-tools
	need redis-benchmark redis-tools
	need curl curl
	[[ $ONLY == daemon ]] || need nginx nginx-light
	[[ -x /usr/bin/python3 ]] || die "/usr/bin/python3 not found"

	if [[ ${BENCH_NO_MAKE:-0} != 1 ]]; then
		say "make"
		make -C "$ROOT" >&2 || die "make failed"
	fi
	[[ -r $LUA ]] || die "$LUA not found"
	[[ $ONLY == ceilings || -x $BIN ]] || die "$BIN not found"

	LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
	WORK=$(mktemp -d "${TMPDIR:-/tmp}/ratelimitd-bench.XXXXXX") || die "mktemp failed"
	start_redis
	say "work directory $WORK, redis on port $REDIS_PORT"

	if [[ $ONLY != daemon ]]; then
		ceiling_redis
		ceiling_nginx 1
		# What N worker processes do to a plain HTTP server on these
		# cores, beside the daemon's N workers (information only: the
		# ceiling stays the one process).
		local n
		for n in $WORKERS_LIST; do
			((n > 1)) && ceiling_nginx "$n"
		done
	fi
	RSS_LINES=()
	BATCH_LINES=()
	PEER_LINES=()
	if [[ $ONLY != ceilings ]]; then
		third_limit
		setup_peer
		local w
		for w in $WORKERS_LIST; do
			bench_daemon "$w"
		done
	fi

	LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)
	report | tee ${BENCH_OUT:+"$BENCH_OUT"}
	((ERRORS == 0)) || { say "$ERRORS step(s) failed to run"; exit 1; }
}

report() {
	local r peer_desc=
	[[ -z $PEER_DIR ]] || peer_desc="; peer fw = the fw load, between hot and fw2, against a Node.js sidecar on rate-limiter-flexible's RateLimiterRedis (one Lua call per check, ioredis auto-pipelining) with as many processes as workers"
	echo
	echo "## ratelimitd bench ($(date -u +%Y-%m-%dT%H:%M:%SZ), $(nproc) CPUs, wrk -t1 -c$CONNS, ${DURATION}s runs after ${WARMUP}s warm-up)"
	echo
	echo "Scenarios: fw/tb/three = /check with X-Api-Key over $NKEYS random keys (fw: fixed_window; tb: token_bucket; three: ${THIRD_DESC:-n/a}); hot = one key over its limit (all denied); fw2 = fw repeated; fw-single = fw on a daemon with redis.max_batch 1 (one script call per check, batching off)$peer_desc. CPU% is of one core (200 = both), from /proc over the measured run; loadgen = wrk or redis-benchmark. Ratio: vs the redis EVALSHA ceiling (fixed_window script) or vs nginx."
	echo
	echo "| scenario | workers | req/s | p50 ms | p99 ms | daemon CPU% | redis CPU% | loadgen CPU% | ratio vs ceiling |"
	echo "|---|---|---|---|---|---|---|---|---|"
	for r in "${ROWS[@]}"; do echo "$r"; done
	echo
	echo "Load average (1/5/15 min) before: $LOAD_BEFORE, after: $LOAD_AFTER (other processes compete for the same $(nproc) CPUs; the bench itself adds about 2)."
	echo "Ceilings: redis EVALSHA ${REDIS_RPS:-n/a} req/s; nginx return 204 ${NGINX_RPS:-n/a} req/s."
	for r in "${RSS_LINES[@]}"; do echo "$r"; done
	for r in "${BATCH_LINES[@]}"; do echo "$r"; done
	for r in "${PEER_LINES[@]}"; do echo "$r"; done
	if ((${#TARGETS[@]})); then
		echo
		echo "Targets (informational; with -c$CONNS closed-loop, mean latency = $CONNS / req/s, so p99 <= $T_P99_MS ms needs well over $((CONNS * 1000))/s):"
		for r in "${TARGETS[@]}"; do echo "- $r"; done
	fi
	if ((${#NOTES[@]})); then
		echo
		echo "Notes:"
		for r in "${NOTES[@]}"; do echo "- $r"; done
	fi
}

main "$@"
