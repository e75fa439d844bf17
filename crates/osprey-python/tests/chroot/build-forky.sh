#!/usr/bin/env bash
# Builds (once) a Debian testing ("forky") root filesystem with CPython 3.13,
# 3.14 and 3.15, for the container tests: their interpreters run under
# `chroot`, so the sampler only reaches their files through /proc/PID/root.
#
#   build-forky.sh [DIR]     (default: $OSPREY_FORKY or /var/cache/osprey/forky)
#
# Idempotent: a finished tree has DIR/.osprey-ready listing its packages; a
# run with the same list does nothing. Concurrent runs wait on a lock. Uses
# the Debian mirror apt already uses on this machine. Needs root.
set -euo pipefail

dir=${1:-${OSPREY_FORKY:-/var/cache/osprey/forky}}
pkgs="python3.13 python3.14 python3.15 libpython3.13-dev libpython3.14-dev libpython3.15-dev"
stamp="$dir/.osprey-ready"

ready() { [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$pkgs" ]; }
# shellcheck source=../cached.sh
. "$(dirname "$0")/../cached.sh"
lock_unless_ready "$dir"
mirror=$(debian_mirror)

start=$(date +%s)
if [ ! -x "$dir/usr/bin/apt-get" ]; then
    # An interrupted debootstrap may have left /proc and friends mounted there.
    awk -v d="$dir/" 'index($2, d) == 1 {print $2}' /proc/mounts | sort -r | xargs -r umount -l
    rm -rf "$dir"
    debootstrap --variant=minbase forky "$dir" "$mirror" /usr/share/debootstrap/scripts/sid >"$dir.log" 2>&1 \
        || { echo "build-forky: debootstrap failed, see $dir.log" >&2; exit 1; }
fi
apt_in() { chroot "$dir" env DEBIAN_FRONTEND=noninteractive apt-get -o Acquire::Check-Valid-Until=false -qq "$@"; }
apt_in update >>"$dir.log" 2>&1
# Packages this suite does not have (yet) are left out, not fatal.
avail=()
for p in $pkgs; do
    if chroot "$dir" apt-cache show "$p" >/dev/null 2>&1; then avail+=("$p"); else echo "build-forky: no $p in forky" >&2; fi
done
apt_in install -y --no-install-recommends "${avail[@]}" >>"$dir.log" 2>&1 \
    || { echo "build-forky: apt-get install failed, see $dir.log" >&2; exit 1; }
apt_in clean
echo "$pkgs" >"$stamp"
echo "build-forky: $dir ready in $(( $(date +%s) - start )) s" >&2
