#!/usr/bin/env bash
# make soak: the sanitized daemon under load through a bounded storm of
# Redis faults and policy reloads, all on 127.0.0.1.
#
# Builds build/asan/ratelimitd (ASan + UBSan, clang), starts two
# redis-servers and the daemon (server.workers: 2, redis.timeout: 50ms) on
# free ports in a temporary directory, with a policy that has a route for
# each algorithm, a route with three limits, a route with failure_mode:
# closed and a route kept for the exactness check at the end, all keyed by
# X-Api-Key. Then, for SOAK_SECONDS:
#
#   load     wrk -t1 -c20 over the six algorithm routes and the mixed one,
#            3,000 keys plus 8 hot keys that go over their limits; a second
#            wrk -t1 -c4 on the fail-closed route. scripts/soak/load.lua
#            counts the replies by status (and the degraded ones).
#   faults   after a warm-up, one at a time, in shuffled rounds, each
#            undone before the next: SIGSTOP/SIGCONT of Redis for 0.3-1 s;
#            kill -9 of Redis and a restart on its port (an empty script
#            cache: the NOSCRIPT path); SCRIPT FLUSH; CLIENT KILL TYPE
#            normal; DEBUG SLEEP 0.2; a SIGHUP reload with changed limits;
#            a reload that moves redis.address to the second Redis and one
#            that moves it back; a policy with a syntax error (must be
#            refused, the old one staying in force).
#   watch    scripts/soak/monitor.py: GET /healthz every 0.25 s (200 within
#            1 s, always), the daemon's RSS, whether it is alive.
#
# At the end: a fresh key on a fixed_window route of limit 50 gets 100
# concurrent checks (scripts/soak/exact.py): exactly 50 must be 200; a
# /metrics scrape, whose ratelimitd_checks_total must match what wrk
# counted; the RSS, at most twice that after the warm-up and under 64 MB;
# SIGTERM, which must end the daemon with status 0 within drain_timeout +
# 5 s, with no sanitizer report on its stderr. Replies must be 200 or 429,
# and 503 only on the fail-closed route. The summary
# table says what passed; the exit status is non-zero when anything failed
# (or failed to run), and the work directory (policies, logs, wrk counts)
# is then kept and named.
#
# Environment:
#   SOAK_SECONDS  seconds of load (default 60; at least 20)
#   SOAK_SEED     seed of the fault order, pauses and keys (default: the time)
#   SOAK_FAULTS   the fault kinds to inject, of: pause restart flush
#                 clientkill debugsleep reload move badpolicy; or all
#                 (default) or none (load only)
#   SOAK_ASAN_OPTIONS  ASAN_OPTIONS for the daemon (default below)
#   SOAK_NO_MAKE  1 = do not build (use what is in build/asan/)
#   SOAK_KEEP     1 = keep the work directory even when everything passed
#   RATELIMITD_BIN  the binary (default build/asan/ratelimitd)

set -uo pipefail
export LC_ALL=C

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
HERE="$ROOT/scripts/soak"
# shellcheck source=scripts/procs.sh
. "$ROOT/scripts/procs.sh"
BIN=${RATELIMITD_BIN:-$ROOT/build/asan/ratelimitd}
PY=/usr/bin/python3
DURATION=${SOAK_SECONDS:-60}
SEED=${SOAK_SEED:-$(date +%s)}

NKEYS=3000          # keys of the load, besides 8 hot keys
CONNS=20            # wrk connections on the fail-open routes
CONNS_CLOSED=4      # and on the fail-closed route
EXACT_N=50          # limit of the exact route: 2N checks, N must pass
DRAIN_S=5           # server.drain_timeout in the policy
EXIT_MARGIN_S=5     # SIGTERM to exit: at most DRAIN_S + this
RSS_CAP_KB=65536    # RSS at the end below 64 MB (ASan's own memory included)
RSS_GROWTH=2        # and at most this many times the RSS after the warm-up
INFLIGHT_SLACK=$((CONNS + CONNS_CLOSED))  # replies wrk counted that /metrics may not yet

OPEN_ROUTES=fw,swl,swc,tb,lb,gcra,mix
ALL_FAULTS="pause restart flush clientkill debugsleep reload move badpolicy"
FAULTS_WANTED=${SOAK_FAULTS:-all}
[[ $FAULTS_WANTED == all ]] && FAULTS_WANTED=$ALL_FAULTS
[[ $FAULTS_WANTED == none ]] && FAULTS_WANTED=
read -r -a FAULT_KINDS <<<"$FAULTS_WANTED"

WORK=
PIDS=()
REDIS_PID=() REDIS_PORT=()
FAILED=0

say() { printf '[soak %s] %s\n' "$(date +%T)" "$*" >&2; }
die() { say "error: $*"; FAILED=1; exit 1; }

cleanup() {
	local pid
	# A Redis left stopped by a fault would not see its SIGTERM.
	for pid in "${REDIS_PID[@]}"; do
		[[ -n $pid ]] && kill -CONT "$pid" 2>/dev/null
	done
	stop_started
	if [[ -n $WORK && -d $WORK ]]; then
		if ((FAILED)) || [[ ${SOAK_KEEP:-0} == 1 ]]; then
			say "work directory kept: $WORK"
		else
			rm -rf -- "$WORK"
		fi
	fi
}
trap cleanup EXIT
trap 'FAILED=1; exit 130' INT
trap 'FAILED=1; exit 143' TERM

rss_kb() {
	awk '/^VmRSS:/ { print $2; found = 1 } END { if (!found) print 0 }' "/proc/$1/status" 2>/dev/null || echo 0
}

mb() { awk -v k="$1" 'BEGIN { printf "%.1f", k / 1024 }'; }

# rand_ms LO HI: a whole number of milliseconds in [LO, HI], from $RANDOM.
rand_ms() { echo $(($1 + RANDOM % ($2 - $1 + 1))); }
sleep_ms() { sleep "$(awk -v m="$1" 'BEGIN { printf "%.3f", m / 1000 }')"; }

# ---- Redis ------------------------------------------------------------------

# start_redis N: redis-server N (1 or 2) on REDIS_PORT[N], picked on first
# start and kept across restarts. DEBUG is enabled for local connections,
# which is where the fault loop sends it from.
start_redis() {
	local n=$1 try i
	[[ -n ${REDIS_PORT[n]:-} ]] || REDIS_PORT[n]=$(free_port)
	mkdir -p "$WORK/redis$n"
	for ((try = 0; try < 5; try++)); do
		redis-server --port "${REDIS_PORT[n]}" --bind 127.0.0.1 --save '' --appendonly no \
			--enable-debug-command local --dir "$WORK/redis$n" \
			--logfile "$WORK/redis$n/redis.log" >/dev/null 2>&1 &
		REDIS_PID[n]=$!
		PIDS+=("${REDIS_PID[n]}")
		for ((i = 0; i < 100; i++)); do
			[[ $(rcli "$n" PING 2>/dev/null) == PONG ]] && return 0
			kill -0 "${REDIS_PID[n]}" 2>/dev/null || break
			sleep 0.05
		done
		kill -KILL "${REDIS_PID[n]}" 2>/dev/null
		wait "${REDIS_PID[n]}" 2>/dev/null
		forget_pid "${REDIS_PID[n]}"
		sleep 0.2
	done
	die "redis-server $n did not start on port ${REDIS_PORT[n]} (see $WORK/redis$n/redis.log)"
}
rcli() { local n=$1; shift; timeout 10 redis-cli -p "${REDIS_PORT[n]}" "$@"; }

# ---- policy -----------------------------------------------------------------

# policy_text REDIS SCALE: the soak policy on Redis N, the load routes'
# limits multiplied by SCALE (a reload with changed limits flips it between
# 1 and 2). Limits are low enough that the hot keys are denied; the exact
# route is the same at every scale.
policy_text() {
	local r=${REDIS_PORT[$1]} s=$2
	cat <<EOF
# Written by scripts/soak.sh (redis $1, scale $s).
server:
  listen: 127.0.0.1:$DAEMON_PORT
  workers: 2
  drain_timeout: ${DRAIN_S}s
redis:
  address: 127.0.0.1:$r
  timeout: 50ms
  connect_timeout: 500ms
  key_prefix: "soak:"
log:
  level: info
failure_mode: open
routes:
  - name: fw
    match: { prefix: /fw/ }
    key: header:X-Api-Key
    limits:
      - { algorithm: fixed_window, limit: $((10 * s)), window: 10s }
  - name: swl
    match: { prefix: /swl/ }
    key: header:X-Api-Key
    limits:
      - { algorithm: sliding_window_log, limit: $((10 * s)), window: 10s }
  - name: swc
    match: { prefix: /swc/ }
    key: header:X-Api-Key
    limits:
      - { algorithm: sliding_window_counter, limit: $((10 * s)), window: 10s, precision: 1s }
  - name: tb
    match: { prefix: /tb/ }
    key: header:X-Api-Key
    limits:
      - { algorithm: token_bucket, rate: "$((2 * s))/s", burst: $((5 * s)) }
  - name: lb
    match: { prefix: /lb/ }
    key: header:X-Api-Key
    limits:
      - { algorithm: leaky_bucket, rate: "$((2 * s))/s", burst: $((5 * s)), delay: false }
  - name: gcra
    match: { prefix: /gcra/ }
    key: header:X-Api-Key
    limits:
      - { algorithm: gcra, rate: "$((2 * s))/s", burst: $((5 * s)) }
  - name: mix
    match: { prefix: /mix/ }
    key: header:X-Api-Key
    limits:
      - { name: window, algorithm: fixed_window, limit: $((20 * s)), window: 10s }
      - { name: bucket, algorithm: token_bucket, rate: "$((3 * s))/s", burst: $((6 * s)) }
      - { name: cell, algorithm: gcra, rate: "$((3 * s))/s", burst: $((6 * s)) }
  - name: closed
    match: { prefix: /closed/ }
    key: header:X-Api-Key
    failure_mode: closed
    limits:
      - { algorithm: sliding_window_counter, limit: $((10 * s)), window: 10s, precision: 1s }
      - { algorithm: token_bucket, rate: "$((2 * s))/s", burst: $((5 * s)) }
  - name: exact
    match: { prefix: /exact/ }
    key: header:X-Api-Key
    limits:
      - { algorithm: fixed_window, limit: $EXACT_N, window: 1h }
EOF
}

# The same with a YAML syntax error at its end (an unclosed flow mapping).
bad_policy_text() {
	policy_text "$@"
	printf '  - name: broken\n    match: { prefix: /broken/\n'
}

POLICY= CUR_REDIS=1 CUR_SCALE=1
# install_policy TEXT-FUNCTION ARGS...: replaces the policy file in one
# rename, as an editor or a ConfigMap update does.
install_policy() {
	"$@" >"$POLICY.tmp" && mv -f "$POLICY.tmp" "$POLICY"
}

# ---- daemon -----------------------------------------------------------------

DAEMON_PID= DAEMON_PORT= URL=

# daemon_alive: the daemon runs (a zombie, dead but not yet waited for,
# does not).
daemon_alive() {
	local st
	st=$(awk '/^State:/ { print $2 }' "/proc/$DAEMON_PID/status" 2>/dev/null)
	[[ -n $st && $st != Z ]]
}

metrics() { curl -s --max-time 5 "$URL/metrics"; }
# metric_sum REGEX: the sum of the samples whose line matches REGEX.
metric_sum() { metrics | awk -v re="$1" '$0 ~ re && !/^#/ { n += $NF } END { printf "%d\n", n }'; }
reloads() { metric_sum "^ratelimitd_config_reloads_total\\{result=\"$1\"\\}"; }
# policy_field PYEXPR: a value of /v1/policy (p is the parsed JSON).
policy_field() {
	curl -s --max-time 5 "$URL/v1/policy" |
		$PY -c "import json, sys; p = json.load(sys.stdin); print($1)" 2>/dev/null
}

# ASan keeps freed memory in a quarantine, to catch a use after free, of
# 256 MB by default: under this load it fills at about 4 MB a second, and
# the daemon's RSS would measure it rather than the daemon. 8 MB still
# holds the last 2 s or so of frees, longer than a check's memory can be
# wanted after it is freed (a reply from a stopped Redis is dropped once
# the stall watchdog gives up on the link, after 1 s). Free pages go back
# to the system every second rather than every 5, so that a sample sees the
# memory in use more than what a fault's burst left behind. (ASan's own
# allocator still creeps up a few MB a minute through the faults; the
# release build, RATELIMITD_BIN=build/ratelimitd, stays flat.)
ASAN_SOAK_OPTIONS=${SOAK_ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:quarantine_size_mb=8:allocator_release_to_os_interval_ms=1000}
start_daemon() {
	ASAN_OPTIONS=$ASAN_SOAK_OPTIONS \
	UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
		"$BIN" -c "$POLICY" >"$WORK/daemon.out" 2>"$WORK/daemon.err" &
	DAEMON_PID=$!
	PIDS+=("$DAEMON_PID")
	local i
	for ((i = 0; i < 400; i++)); do
		kill -0 "$DAEMON_PID" 2>/dev/null || break
		[[ $(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "$URL/readyz") == 200 ]] && return 0
		sleep 0.05
	done
	die "daemon not ready within 20 s: $(tail -5 "$WORK/daemon.err")"
}

# wait_reload RESULT BEFORE: waits up to 5 s for the reloads_total of
# RESULT to pass BEFORE.
wait_reload() {
	local i
	for ((i = 0; i < 50; i++)); do
		(($(reloads "$1") > $2)) && return 0
		sleep 0.1
	done
	return 1
}

# reload_to REDIS SCALE: installs that policy, sends SIGHUP, and checks
# that it is in force (the reload counter, /v1/policy's address and fw
# limit).
reload_to() {
	local before want
	before=$(reloads success)
	install_policy policy_text "$1" "$2"
	kill -HUP "$DAEMON_PID"
	if ! wait_reload success "$before"; then
		fault_error "reload to redis $1, scale $2: ratelimitd_config_reloads_total{result=\"success\"} stayed at $before"
		return 1
	fi
	CUR_REDIS=$1 CUR_SCALE=$2
	want="127.0.0.1:${REDIS_PORT[$1]} $((10 * $2))"
	local i got=
	for ((i = 0; i < 30; i++)); do
		got=$(policy_field 'p["redis"]["address"], [r for r in p["routes"] if r["name"] == "fw"][0]["limits"][0]["limit"]')
		[[ $got == "$want" ]] && return 0
		sleep 0.1
	done
	fault_error "reload to redis $1, scale $2: /v1/policy says '$got', expected '$want'"
	return 1
}

# ---- faults -----------------------------------------------------------------

declare -A FAULTS=()
FAULT_ERRORS=()
fault_error() { FAULT_ERRORS+=("$*"); say "fault error: $*"; }

fault_pause() {
	local ms pid=${REDIS_PID[CUR_REDIS]}
	ms=$(rand_ms 300 1000)
	kill -STOP "$pid"
	sleep_ms "$ms"
	kill -CONT "$pid"
	FAULT_DETAIL="redis $CUR_REDIS stopped ${ms} ms"
}

fault_restart() {
	local n=$CUR_REDIS pid=${REDIS_PID[CUR_REDIS]}
	kill -KILL "$pid"
	wait "$pid" 2>/dev/null
	forget_pid "$pid"
	start_redis "$n"
	FAULT_DETAIL="redis $n killed, restarted on ${REDIS_PORT[n]}"
}

fault_flush() {
	[[ $(rcli "$CUR_REDIS" SCRIPT FLUSH) == OK ]] || fault_error "SCRIPT FLUSH failed"
}

fault_clientkill() {
	local n
	n=$(rcli "$CUR_REDIS" CLIENT KILL TYPE normal)
	FAULT_DETAIL="$n links killed"
}

fault_debugsleep() {
	[[ $(rcli "$CUR_REDIS" DEBUG SLEEP 0.2) == OK ]] || fault_error "DEBUG SLEEP failed"
}

fault_reload() {
	local s=$((3 - CUR_SCALE))
	reload_to "$CUR_REDIS" "$s" && FAULT_DETAIL="limits x$s"
}

# Moves to the other Redis, lets the load run there for 1-2 s, moves back.
fault_move() {
	local from=$CUR_REDIS to=$((3 - CUR_REDIS))
	reload_to "$to" "$CUR_SCALE" || return
	sleep_ms "$(rand_ms 1000 2000)"
	reload_to "$from" "$CUR_SCALE"
	FAULT_DETAIL="redis $from -> $to -> $from"
}

# A file with a syntax error must be refused and the policy in force stay;
# then the good file goes back.
fault_badpolicy() {
	local before_err before_policy after_policy
	before_err=$(reloads error)
	before_policy=$(curl -s --max-time 5 "$URL/v1/policy")
	install_policy bad_policy_text "$CUR_REDIS" "$CUR_SCALE"
	kill -HUP "$DAEMON_PID"
	if ! wait_reload error "$before_err"; then
		fault_error "policy with a syntax error: ratelimitd_config_reloads_total{result=\"error\"} stayed at $before_err"
	fi
	after_policy=$(curl -s --max-time 5 "$URL/v1/policy")
	if [[ $before_policy != "$after_policy" || -z $after_policy ]]; then
		fault_error "policy with a syntax error: /v1/policy changed"
	fi
	[[ $(metric_sum '^ratelimitd_config_last_reload_successful') == 0 ]] ||
		fault_error "policy with a syntax error: ratelimitd_config_last_reload_successful is not 0"
	reload_to "$CUR_REDIS" "$CUR_SCALE"
}

# fault_loop END: one fault after another, each kind once per shuffled
# round, 0.5-1.5 s of plain load between them, until the time END (s).
FAULT_LOG=()
fault_loop() {
	local end=$1 kind round=0 t0
	if ((${#FAULT_KINDS[@]} == 0)); then
		sleep $((end - $(date +%s)))
		return 0
	fi
	while :; do
		round=$((round + 1))
		local order=("${FAULT_KINDS[@]}") i j tmp
		for ((i = ${#order[@]} - 1; i > 0; i--)); do
			j=$((RANDOM % (i + 1)))
			tmp=${order[i]} order[i]=${order[j]} order[j]=$tmp
		done
		for kind in "${order[@]}"; do
			(($(date +%s) < end)) || return 0
			daemon_alive || return 0
			FAULT_DETAIL=
			t0=$EPOCHREALTIME
			"fault_$kind"
			FAULTS[$kind]=$((${FAULTS[$kind]:-0} + 1))
			FAULT_LOG+=("$(awk -v a="$t0" -v b="$START" 'BEGIN { printf "%6.1f", a - b }') s  $kind${FAULT_DETAIL:+  ($FAULT_DETAIL)}")
			say "fault: $kind${FAULT_DETAIL:+ ($FAULT_DETAIL)}"
			sleep_ms "$(rand_ms 500 1500)"
		done
	done
}

# ---- the exactness check ----------------------------------------------------

# exact_check: 2N concurrent checks of a fresh key on the exact route; N
# must be allowed and N denied. An attempt with a reply from the failure
# mode (Redis did not answer within redis.timeout) says nothing about
# exactness: it is shown and another key tried, three attempts at most.
EXACT_RESULT= EXACT_OK=0 EXACT_SENT=0
exact_check() {
	local attempt out s200 s429 deg other
	for ((attempt = 1; attempt <= 3; attempt++)); do
		# fixed_window counts per aligned hour: keep 2N checks in one.
		local into=$(($(date +%s) % 3600))
		((into < 3590)) || sleep $((3601 - into))
		out=$($PY "$HERE/exact.py" "$DAEMON_PORT" /exact/item "exact-$SEED-$$-$attempt" "$EXACT_N")
		EXACT_SENT=$((EXACT_SENT + 2 * EXACT_N))
		printf '%s\n' "$out" >"$WORK/exact-$attempt.out"
		s200=$(awk '$1 == "status_200" { print $2 }' <<<"$out")
		s429=$(awk '$1 == "status_429" { print $2 }' <<<"$out")
		deg=$(awk '$1 == "degraded" { print $2 }' <<<"$out")
		other=$(awk '$1 != "status_200" && $1 != "status_429" && $1 != "degraded" { printf "%s%s=%s", s, $1, $2; s = " " }' <<<"$out")
		EXACT_RESULT+="${EXACT_RESULT:+; }attempt $attempt: ${s200:-0} x 200, ${s429:-0} x 429${deg:+, $deg degraded}${other:+, $other}"
		if [[ -n $deg || -n $other ]]; then
			say "exactness attempt $attempt inconclusive: $out"
			sleep 1
			continue
		fi
		[[ ${s200:-0} == "$EXACT_N" && ${s429:-0} == "$EXACT_N" ]] && EXACT_OK=1
		return
	done
}

# ---- summary ----------------------------------------------------------------

ROWS=()
# row CHECK SEEN OK: one line of the table; OK 1 passes, 0 fails.
row() {
	local v=PASS
	if [[ $3 != 1 ]]; then v=FAIL FAILED=1; fi
	ROWS+=("| $1 | $2 | $v |")
}

# wrk_val FILE NAME: a count from a wrk output file (0 if absent).
wrk_val() { awk -v k="$2" '$1 == k { v = $2 } END { printf "%d\n", v + 0 }' "$1" 2>/dev/null || echo 0; }
# wrk_statuses FILE: "200=N 429=N ..." in status order.
wrk_statuses() { awk '/^status_/ { sub(/status_/, "", $1); print $1, $2 }' "$1" 2>/dev/null | sort -n | awk '{ printf "%s%s=%s", s, $1, $2; s = " " }'; }

# ---- main -------------------------------------------------------------------

main() {
	((DURATION >= 20)) || die "SOAK_SECONDS must be at least 20"
	need wrk wrk
	need redis-server redis-server
	need redis-cli redis-tools
	need curl curl
	[[ -x $PY ]] || die "$PY not found"
	if [[ ${SOAK_NO_MAKE:-0} != 1 ]]; then
		need clang clang
		say "make SANITIZE=address,undefined CC=clang build/asan/ratelimitd"
		make -C "$ROOT" SANITIZE=address,undefined CC=clang build/asan/ratelimitd >&2 || die "make failed"
	fi
	[[ -x $BIN ]] || die "$BIN not found"
	local k
	for k in "${FAULT_KINDS[@]}"; do
		[[ " $ALL_FAULTS " == *" $k "* ]] || die "SOAK_FAULTS: unknown fault '$k' (known: $ALL_FAULTS, all, none)"
	done
	RANDOM=$SEED

	WORK=$(mktemp -d "${TMPDIR:-/tmp}/ratelimitd-soak.XXXXXX") || die "mktemp failed"
	POLICY=$WORK/policy.yaml
	start_redis 1
	start_redis 2
	DAEMON_PORT=$(free_port)
	URL=http://127.0.0.1:$DAEMON_PORT
	say "work directory $WORK; redis on ports ${REDIS_PORT[1]} and ${REDIS_PORT[2]}, daemon on $DAEMON_PORT; seed $SEED"

	# Every policy the soak installs must validate; the broken one must not.
	local n s
	for n in 1 2; do
		for s in 1 2; do
			policy_text "$n" "$s" >"$WORK/check.yaml"
			"$BIN" -t -c "$WORK/check.yaml" >"$WORK/check.out" 2>&1 ||
				die "policy (redis $n, scale $s) refused by ratelimitd -t: $(head -5 "$WORK/check.out")"
		done
	done
	bad_policy_text 1 1 >"$WORK/check.yaml"
	if "$BIN" -t -c "$WORK/check.yaml" >"$WORK/check.out" 2>&1; then
		die "the policy with a syntax error passed ratelimitd -t"
	fi
	say "ratelimitd -t on the broken policy: $(head -1 "$WORK/check.out")"
	install_policy policy_text 1 1
	start_daemon
	say "daemon ready (pid $DAEMON_PID)"

	# Watcher, then load, then faults after the warm-up.
	local max_s=$((DURATION + 180))
	$PY "$HERE/monitor.py" "$DAEMON_PID" "$DAEMON_PORT" "$WORK/monitor.stop" \
		"$WORK/monitor.out" "$max_s" &
	local mon=$!
	PIDS+=("$mon")
	START=$EPOCHREALTIME
	local wrk_open wrk_closed
	SOAK_WRK_OUT=$WORK/wrk-open.counts timeout $((DURATION + 30)) \
		wrk -t1 -c"$CONNS" -d"${DURATION}s" --timeout 5s -s "$HERE/load.lua" "$URL/check" \
		-- "$OPEN_ROUTES" "$NKEYS" "$SEED" >"$WORK/wrk-open.out" 2>&1 &
	wrk_open=$!
	PIDS+=("$wrk_open")
	SOAK_WRK_OUT=$WORK/wrk-closed.counts timeout $((DURATION + 30)) \
		wrk -t1 -c"$CONNS_CLOSED" -d"${DURATION}s" --timeout 5s -s "$HERE/load.lua" "$URL/check" \
		-- closed "$NKEYS" "$((SEED + 1))" >"$WORK/wrk-closed.out" 2>&1 &
	wrk_closed=$!
	PIDS+=("$wrk_closed")

	local warmup=$((DURATION / 6 < 10 ? DURATION / 6 : 10))
	say "load: wrk -c$CONNS on $OPEN_ROUTES, wrk -c$CONNS_CLOSED on closed, ${DURATION}s; faults after ${warmup}s of warm-up"
	sleep "$warmup"
	local rss_warm
	rss_warm=$(rss_kb "$DAEMON_PID")
	say "RSS after warm-up: $(mb "$rss_warm") MB"

	fault_loop $(($(date +%s) + DURATION - warmup - 3))
	say "faults stopped; waiting for wrk"
	wait "$wrk_open"
	local rc_open=$?
	wait "$wrk_closed"
	local rc_closed=$?
	forget_pid "$wrk_open"
	forget_pid "$wrk_closed"

	# Settle: the policy in force is the base one, Redis answers.
	local alive=1
	daemon_alive || alive=0
	if ((alive)); then
		[[ $CUR_REDIS == 1 && $CUR_SCALE == 1 ]] || reload_to 1 1
		local i ready=0
		for ((i = 0; i < 100; i++)); do
			if [[ $(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "$URL/readyz") == 200 ]]; then
				ready=1
				break
			fi
			sleep 0.1
		done
		((ready)) || say "not ready 10 s after the faults: $(curl -s --max-time 2 "$URL/readyz")"
		exact_check
	fi

	# Scrape, RSS, then stop.
	local scrape_ok=0 checks=0 rss_end=0
	daemon_alive || alive=0
	if ((alive)) && metrics >"$WORK/metrics.txt" && grep -q '^ratelimitd_checks_total' "$WORK/metrics.txt"; then
		scrape_ok=1
		checks=$(awk '/^ratelimitd_checks_total\{/ { n += $NF } END { printf "%d\n", n }' "$WORK/metrics.txt")
	fi
	((alive)) && rss_end=$(rss_kb "$DAEMON_PID")
	touch "$WORK/monitor.stop"
	wait "$mon"
	forget_pid "$mon"

	local stop_rc=none stop_s=n/a t0
	daemon_alive || alive=0
	if ((alive)); then
		t0=$EPOCHREALTIME
		kill -TERM "$DAEMON_PID"
		for ((i = 0; i < (DRAIN_S + EXIT_MARGIN_S) * 20; i++)); do
			daemon_alive || break
			sleep 0.05
		done
		stop_s=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f", b - a }')
		if daemon_alive; then
			stop_rc="still running after ${stop_s} s"
			kill -KILL "$DAEMON_PID"
			wait "$DAEMON_PID" 2>/dev/null
		else
			wait "$DAEMON_PID"
			stop_rc=$?
		fi
	else
		wait "$DAEMON_PID"
		stop_rc="died earlier (status $?)"
	fi
	forget_pid "$DAEMON_PID"

	# ---- verdicts
	local mon_polls mon_misses mon_max mon_rssmax mon_died
	mon_polls=$(wrk_val "$WORK/monitor.out" polls)
	mon_misses=$(wrk_val "$WORK/monitor.out" misses)
	mon_max=$(wrk_val "$WORK/monitor.out" max_ms)
	mon_rssmax=$(wrk_val "$WORK/monitor.out" rss_max_kb)
	mon_died=$(wrk_val "$WORK/monitor.out" died)
	[[ -s $WORK/monitor.out ]] || mon_died=unknown

	local fo=$WORK/wrk-open.counts fc=$WORK/wrk-closed.counts
	local open_total closed_total open_bad closed_bad open_deg closed_deg open_sock closed_sock
	open_total=$(awk '/^status_/ { n += $2 } END { print n + 0 }' "$fo" 2>/dev/null || echo 0)
	closed_total=$(awk '/^status_/ { n += $2 } END { print n + 0 }' "$fc" 2>/dev/null || echo 0)
	open_bad=$(awk '/^status_/ && $1 != "status_200" && $1 != "status_429" { n += $2 } END { print n + 0 }' "$fo" 2>/dev/null)
	closed_bad=$(awk '/^status_/ && $1 != "status_200" && $1 != "status_429" && $1 != "status_503" { n += $2 } END { print n + 0 }' "$fc" 2>/dev/null)
	open_deg=$(wrk_val "$fo" degraded)
	closed_deg=$(wrk_val "$fc" degraded)
	open_sock=$(($(wrk_val "$fo" err_connect) + $(wrk_val "$fo" err_read) + $(wrk_val "$fo" err_write) + $(wrk_val "$fo" err_timeout)))
	closed_sock=$(($(wrk_val "$fc" err_connect) + $(wrk_val "$fc" err_read) + $(wrk_val "$fc" err_write) + $(wrk_val "$fc" err_timeout)))
	local sent=$((open_total + closed_total))

	local san
	san=$(grep -cE 'AddressSanitizer|UndefinedBehaviorSanitizer|LeakSanitizer|runtime error:' "$WORK/daemon.err")

	row "daemon alive through the soak" "$([[ $mon_died == 0 && $alive == 1 ]] && echo yes || echo "no (monitor: died=$mon_died)")" \
		"$([[ $mon_died == 0 && $alive == 1 ]] && echo 1 || echo 0)"
	row "GET /healthz 200 within 1 s, every 0.25 s" "$mon_polls polls, $mon_misses missed, slowest $mon_max ms" \
		"$([[ $mon_misses == 0 && $mon_polls -gt 0 ]] && echo 1 || echo 0)"
	row "wrk ran (open, closed)" "exit $rc_open, $rc_closed; $open_total + $closed_total replies" \
		"$([[ $rc_open == 0 && $rc_closed == 0 && $open_total -gt 0 && $closed_total -gt 0 ]] && echo 1 || echo 0)"
	row "fail-open routes: only 200 and 429" "$(wrk_statuses "$fo"); $open_deg degraded 200s" \
		"$([[ $open_bad == 0 ]] && echo 1 || echo 0)"
	row "fail-closed route: only 200, 429, 503" "$(wrk_statuses "$fc"); $closed_deg degraded" \
		"$([[ $closed_bad == 0 ]] && echo 1 || echo 0)"
	row "wrk socket errors (connect, read, write, timeout)" "open $open_sock, closed $closed_sock" \
		"$([[ $open_sock == 0 && $closed_sock == 0 ]] && echo 1 || echo 0)"
	local fe=${#FAULT_ERRORS[@]}
	row "reloads applied, broken policy refused, old one kept" "$fe problem(s)" "$([[ $fe == 0 ]] && echo 1 || echo 0)"
	local rss_ok=0
	((rss_end > 0 && rss_end < RSS_CAP_KB && rss_end <= RSS_GROWTH * rss_warm)) && rss_ok=1
	row "RSS at the end <= ${RSS_GROWTH}x after warm-up and < $(mb $RSS_CAP_KB) MB" \
		"$(mb "$rss_warm") MB after warm-up, $(mb "$rss_end") MB at the end, $(mb "$mon_rssmax") MB highest" "$rss_ok"
	# wrk stops with up to a request per connection in flight, which the
	# daemon may count and wrk does not; nothing else sends checks.
	row "/metrics scrape; checks_total within $INFLIGHT_SLACK of wrk replies (+ exactness checks)" \
		"checks_total $checks, wrk replies $sent, exactness checks $EXACT_SENT" \
		"$([[ $scrape_ok == 1 && $checks -ge $((sent - INFLIGHT_SLACK)) && $checks -le $((sent + EXACT_SENT + INFLIGHT_SLACK)) ]] && echo 1 || echo 0)"
	row "exactness: $((2 * EXACT_N)) concurrent checks, limit $EXACT_N" "${EXACT_RESULT:-not run}" "$EXACT_OK"
	row "SIGTERM: exit 0 within $((DRAIN_S + EXIT_MARGIN_S)) s" "status $stop_rc after $stop_s s" \
		"$([[ $stop_rc == 0 ]] && echo 1 || echo 0)"
	row "no sanitizer report on stderr" "$san line(s)" "$([[ $san == 0 ]] && echo 1 || echo 0)"

	report "$open_total" "$closed_total"
	((FAILED == 0))
}

report() {
	local r k total=0
	echo
	echo "## ratelimitd soak ($(date -u +%Y-%m-%dT%H:%M:%SZ), ${DURATION}s, seed $SEED, $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg))"
	echo
	if [[ $BIN == */asan/* ]]; then
		what="Sanitized daemon (ASan + UBSan, $BIN)"
	else
		what="Daemon $BIN"
	fi
	echo "$what, server.workers 2, redis.timeout 50ms; wrk -t1 -c$CONNS on $OPEN_ROUTES and wrk -t1 -c$CONNS_CLOSED on closed (failure_mode: closed), X-Api-Key over $NKEYS keys and 8 hot ones."
	echo
	echo "| check | seen | result |"
	echo "|---|---|---|"
	for r in "${ROWS[@]}"; do echo "$r"; done
	echo
	local line="Faults injected:"
	for k in "${FAULT_KINDS[@]}"; do
		line+=" $k ${FAULTS[$k]:-0},"
		total=$((total + ${FAULTS[$k]:-0}))
	done
	echo "${line%,}; $total in all."
	echo "wrk latency p99 / max (ms): open $(awk '$1 == "latency_p99_us" { p = $2 } $1 == "latency_max_us" { m = $2 } END { printf "%.1f / %.1f", p / 1000, m / 1000 }' "$WORK/wrk-open.counts" 2>/dev/null),"\
		"closed $(awk '$1 == "latency_p99_us" { p = $2 } $1 == "latency_max_us" { m = $2 } END { printf "%.1f / %.1f", p / 1000, m / 1000 }' "$WORK/wrk-closed.counts" 2>/dev/null)."
	if [[ -s $WORK/metrics.txt ]]; then
		echo "Daemon counters at the end: $(awk '/^ratelimitd_checks_total\{/ { r = $0; sub(/.*result="/, "", r); sub(/".*/, "", r); n[r] += $NF }
			/^ratelimitd_redis_errors_total\{/ { k = $0; sub(/.*kind="/, "", k); sub(/".*/, "", k); e[k] += $NF }
			/^ratelimitd_config_reloads_total\{/ { k = $0; sub(/.*result="/, "", k); sub(/".*/, "", k); c[k] += $NF }
			END { s = "checks"; for (k in n) s = s " " k "=" n[k]; s = s "; redis errors"; for (k in e) s = s " " k "=" e[k]
			      s = s "; reloads"; for (k in c) s = s " " k "=" c[k]; print s }' "$WORK/metrics.txt")."
	fi
	if [[ -s $WORK/metrics.txt ]]; then
		# Information, not a verdict: on 2 shared cores under ASan the
		# loop is late now and then; SPEC 3.1 wants redis.timeout plus a
		# few ms.
		echo "Check durations (the daemon's histogram, arrival to reply): $(awk '
			/^ratelimitd_check_duration_seconds_bucket\{le="0.05"\}/ { a = $NF }
			/^ratelimitd_check_duration_seconds_bucket\{le="0.1"\}/ { b = $NF }
			/^ratelimitd_check_duration_seconds_bucket\{le="0.25"\}/ { c = $NF }
			/^ratelimitd_check_duration_seconds_bucket\{le="1"\}/ { d = $NF }
			/^ratelimitd_check_duration_seconds_count/ { n = $NF }
			END { printf "%d of %d over 50 ms, %d over 100 ms, %d over 250 ms, %d over 1 s", n - a, n, n - b, n - c, n - d }' "$WORK/metrics.txt")."
	fi
	echo "Daemon RSS (MB) every 5 s: $(awk '$1 == "rss" { printf "%s%.1f", s, $3 / 1024; s = " " }' "$WORK/monitor.out" 2>/dev/null)."
	echo "Daemon log: $(wc -l <"$WORK/daemon.err") lines."
	if ((${#FAULT_ERRORS[@]})); then
		echo
		echo "Fault problems:"
		for r in "${FAULT_ERRORS[@]}"; do echo "- $r"; done
	fi
	if grep -qE 'AddressSanitizer|UndefinedBehaviorSanitizer|LeakSanitizer|runtime error:' "$WORK/daemon.err"; then
		echo
		echo "Sanitizer report (first lines of daemon.err that name one, with what follows):"
		grep -m1 -A12 -E 'AddressSanitizer|UndefinedBehaviorSanitizer|LeakSanitizer|runtime error:' "$WORK/daemon.err" | sed 's/^/    /'
	fi
	if grep -q '^miss ' "$WORK/monitor.out" 2>/dev/null; then
		echo
		echo "Healthz misses (s since the monitor started):"
		grep '^miss ' "$WORK/monitor.out" | sed 's/^/- /'
	fi
	if ((FAILED)); then
		echo
		echo "Fault timeline (s since the load started):"
		for r in "${FAULT_LOG[@]}"; do echo "  $r"; done
		echo
		echo "FAILED; logs in $WORK (daemon.err, wrk-*.counts, monitor.out, redis*/redis.log)"
	else
		echo
		echo "PASSED"
	fi
}

main "$@"
