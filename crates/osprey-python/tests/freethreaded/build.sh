#!/usr/bin/env bash
# Builds (once) a free-threaded CPython 3.13 (PEP 703, `--disable-gil`) from
# Debian trixie's source package (CPython 3.13.5), for the free-threaded
# sampler tests: installs DIR/bin/python3.13t.
#
#   build-313t.sh [DIR]     (default: $OSPREY_PY313T or /var/cache/osprey/python3.13t)
#
# A static build (libpython linked into the executable, as Debian's own
# python3.11 is): no PGO/LTO, since build time matters more than its speed.
# Idempotent: a finished install has DIR/.osprey-ready naming its source and
# configure flags; a run with the same stamp does nothing. Concurrent runs
# wait on a lock. The deb-src line lives in a private apt configuration, so
# the machine's apt sources are left as they are. Needs root (build deps).
set -euo pipefail

dir=${1:-${OSPREY_PY313T:-/var/cache/osprey/python3.13t}}
flags="--disable-gil --prefix=$dir"
want="python3.13/trixie $flags"
stamp="$dir/.osprey-ready"
log="$dir.log"

ready() { [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$dir/bin/python3.13t" ]; }
# shellcheck source=../cached.sh
. "$(dirname "$0")/../cached.sh"
lock_unless_ready "$dir"
mirror=$(debian_mirror)

start=$(date +%s)
: >"$log"
# The compiler and the headers of the modules the tests import (ssl, zlib,
# ctypes); `apt-get source` needs dpkg-dev to unpack.
need=()
for p in build-essential dpkg-dev libssl-dev zlib1g-dev libffi-dev libbz2-dev liblzma-dev; do
    dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"; } >>"$log" 2>&1 \
        || { echo "build-313t: installing ${need[*]} failed, see $log" >&2; exit 1; }
fi

# A private apt state with only trixie's deb-src line: the machine's lists
# and sources stay untouched.
apt_dir="$dir.apt"
mkdir -p "$apt_dir/lists/partial" "$apt_dir/sources.list.d"
echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror trixie main" >"$apt_dir/sources.list"
apt_src() {
    apt-get -o Dir::Etc::SourceList="$apt_dir/sources.list" -o Dir::Etc::SourceParts="$apt_dir/sources.list.d" \
        -o Dir::State::Lists="$apt_dir/lists" -o Acquire::Check-Valid-Until=false -o APT::Sandbox::User=root "$@"
}
apt_src update >>"$log" 2>&1 || { echo "build-313t: apt-get update (trixie deb-src) failed, see $log" >&2; exit 1; }

src="$dir.src"
rm -rf "$src"
mkdir -p "$src"
(cd "$src" && apt_src source --only-source python3.13/trixie) >>"$log" 2>&1 \
    || { echo "build-313t: apt-get source python3.13/trixie failed, see $log" >&2; exit 1; }
tree=$(find "$src" -mindepth 1 -maxdepth 1 -type d -name 'python3.13-*' | head -n1)
[ -n "$tree" ] || { echo "build-313t: no python3.13-* tree under $src, see $log" >&2; exit 1; }

# Debian's patches stay applied (dpkg-source applied them), but its own
# build system (debian/rules) is not used: a plain upstream configure.
# Debian's patches disable ensurepip, which `make install` would run.
rm -rf "$dir"
(cd "$tree" && ./configure $flags && make -j2 && make install ENSUREPIP=no) >>"$log" 2>&1 \
    || { echo "build-313t: configure/make failed, see $log" >&2; exit 1; }
"$dir/bin/python3.13t" -c 'import sys; assert not sys._is_gil_enabled()' >>"$log" 2>&1 \
    || { echo "build-313t: $dir/bin/python3.13t runs with a GIL, see $log" >&2; exit 1; }
rm -rf "$src"
echo "$want" >"$stamp"
echo "build-313t: $dir ready in $(( $(date +%s) - start )) s" >&2
