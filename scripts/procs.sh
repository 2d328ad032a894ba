# The processes a script of make bench or make soak started (sourced by
# scripts/bench.sh and scripts/soak.sh, bash). Each keeps their PIDs in
# PIDS and stops only those, by PID; `die` is the caller's.

# forget_pid PID: no longer one to stop (it has been waited for).
forget_pid() {
	local p keep=()
	for p in "${PIDS[@]}"; do [[ $p == "$1" ]] || keep+=("$p"); done
	PIDS=("${keep[@]}")
}

# stop_started: every process in PIDS gets TERM, up to 5 s, then KILL,
# and is waited for.
stop_started() {
	local pid i
	for pid in "${PIDS[@]}"; do
		kill -0 "$pid" 2>/dev/null && kill -TERM "$pid" 2>/dev/null
	done
	for pid in "${PIDS[@]}"; do
		for ((i = 0; i < 50; i++)); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.1
		done
		kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null
		wait "$pid" 2>/dev/null
	done
	PIDS=()
}

free_port() {
	/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

need() {
	command -v "$1" >/dev/null 2>&1 || die "$1 not found (Debian: apt-get install $2)"
}
