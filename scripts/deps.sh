#!/bin/sh
# Installs the named Debian packages that are not installed yet, so `make run`
# and `make test` work on a fresh Debian 12 machine. Needs root (or sudo).
missing=""
for p in "$@"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
echo "installing:$missing"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO=sudo
# env, inside sudo: sudo's own environment reset would drop the variable.
$SUDO apt-get update -qq &&
	$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	--no-install-recommends $missing >/dev/null
