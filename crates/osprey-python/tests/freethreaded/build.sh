#!/usr/bin/env bash
# Builds (once) a free-threaded CPython (PEP 703, `--disable-gil`) for the
# free-threaded sampler tests: installs DIR/bin/pythonX.Yt.
#
#   build.sh 3.13t [DIR]   Debian trixie's source package (CPython 3.13.5)
#                          default DIR: $OSPREY_PY313T or /var/cache/osprey/python3.13t
#   build.sh 3.14t [DIR]   CPython v3.14.7 from the Go module proxy (Debian's
#                          python3.14 sources are listed but not served here)
#                          default DIR: $OSPREY_PY314T or /var/cache/osprey/python3.14t
#
# A static build (libpython linked into the executable, as Debian's own
# python3.11 is): no PGO/LTO, no ensurepip, no test modules, since build time
# matters more than its speed. Idempotent: a finished install has
# DIR/.osprey-ready naming its source and configure flags; a run with the
# same stamp does nothing. Concurrent runs wait on a lock. The deb-src line
# lives in a private apt configuration, so the machine's apt sources are left
# as they are. Needs root (build deps).
set -euo pipefail

version=${1:-}
case "$version" in
    3.13t) dir=${2:-${OSPREY_PY313T:-/var/cache/osprey/python3.13t}}; source_name="python3.13/trixie" ;;
    3.14t) dir=${2:-${OSPREY_PY314T:-/var/cache/osprey/python3.14t}}; source_name="github.com/python/cpython@v3.14.7+incompatible" ;;
    *) echo "usage: build.sh 3.13t|3.14t [DIR]" >&2; exit 2 ;;
esac
exe="$dir/bin/python$version"
flags="--disable-gil --without-ensurepip --disable-test-modules --prefix=$dir"
want="$source_name $flags"
stamp="$dir/.osprey-ready"
log="$dir.log"
me="build.sh $version"

ready() { [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$exe" ]; }
# shellcheck source=../cached.sh
. "$(dirname "$0")/../cached.sh"
lock_unless_ready "$dir"

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
        || { echo "$me: installing ${need[*]} failed, see $log" >&2; exit 1; }
fi

src="$dir.src"
rm -rf "$src"
mkdir -p "$src"
if [ "$version" = 3.13t ]; then
    # A private apt state with only trixie's deb-src line: the machine's
    # lists and sources stay untouched.
    mirror=$(debian_mirror)
    apt_dir="$dir.apt"
    mkdir -p "$apt_dir/lists/partial" "$apt_dir/sources.list.d"
    echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror trixie main" >"$apt_dir/sources.list"
    apt_src() {
        apt-get -o Dir::Etc::SourceList="$apt_dir/sources.list" -o Dir::Etc::SourceParts="$apt_dir/sources.list.d" \
            -o Dir::State::Lists="$apt_dir/lists" -o Acquire::Check-Valid-Until=false -o APT::Sandbox::User=root "$@"
    }
    apt_src update >>"$log" 2>&1 || { echo "$me: apt-get update (trixie deb-src) failed, see $log" >&2; exit 1; }
    (cd "$src" && apt_src source --only-source "$source_name") >>"$log" 2>&1 \
        || { echo "$me: apt-get source $source_name failed, see $log" >&2; exit 1; }
    # Debian's patches stay applied (dpkg-source applied them); its own build
    # system (debian/rules) is not used: a plain upstream configure.
    tree=$(find "$src" -mindepth 1 -maxdepth 1 -type d -name 'python3.13-*' | head -n1)
else
    # The proxy serves any tagged GitHub repository as a module zip: the
    # tag's tree, checksummed against the Go checksum database.
    command -v go >/dev/null || { echo "$me: needs go (the module proxy serves the source)" >&2; exit 1; }
    mod=$(cd "$src" && GOFLAGS=-mod=mod go mod download -json "$source_name" 2>>"$log" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
    [ -n "$mod" ] && [ -f "$mod/configure" ] || { echo "$me: go mod download $source_name failed, see $log" >&2; exit 1; }
    cp -r "$mod" "$src/cpython" && chmod -R u+w "$src/cpython" && chmod +x "$src/cpython/configure"
    tree="$src/cpython"
fi
[ -n "$tree" ] || { echo "$me: no source tree under $src, see $log" >&2; exit 1; }

rm -rf "$dir"
# shellcheck disable=SC2086 # $flags is a list of words
(cd "$tree" && ./configure $flags && make -j2 && make install) >>"$log" 2>&1 \
    || { echo "$me: configure/make failed, see $log" >&2; exit 1; }
"$exe" -c 'import sys; assert not sys._is_gil_enabled()' >>"$log" 2>&1 \
    || { echo "$me: $exe runs with a GIL, see $log" >&2; exit 1; }
rm -rf "$src"
echo "$want" >"$stamp"
echo "$me: $dir ready in $(( $(date +%s) - start )) s" >&2
