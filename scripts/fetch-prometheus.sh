#!/bin/sh
# Unpacks Debian's prometheus package (prometheus and promtool) under
# build/prometheus for the alerting-rule tests, without installing it:
# installing enables and starts a Prometheus service listening on :9090,
# which a test run has no business leaving on a developer's machine.
# `apt-get download` needs no root, only the package lists (apt-get update).
set -e
dir=build/prometheus
[ -x "$dir/usr/bin/promtool" ] && [ -x "$dir/usr/bin/prometheus" ] && exit 0
mkdir -p "$dir"
cd "$dir"
rm -f prometheus_*.deb
# As root, apt warns that its _apt user cannot write here: not an error.
# A machine whose package lists were cleaned (a container image) needs
# them fetched once, as scripts/deps.sh does.
if ! apt-get download prometheus >apt.log 2>&1; then
	SUDO=""
	[ "$(id -u)" -ne 0 ] && SUDO=sudo
	$SUDO apt-get update -qq >/dev/null 2>&1 || true
fi
if [ ! -f prometheus_*.deb ] && ! apt-get download prometheus >apt.log 2>&1; then
	grep -v "^W: Download is performed unsandboxed" apt.log >&2 || true
	echo "fetch-prometheus: apt-get download prometheus failed;" \
	    "run apt-get update (as root) and try again" >&2
	exit 1
fi
rm -f apt.log
dpkg-deb -x prometheus_*.deb .
rm -f prometheus_*.deb
