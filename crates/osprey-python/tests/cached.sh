# Sourced by the build scripts of cached test interpreters
# (chroot/build-forky.sh, freethreaded/build.sh).

# lock_unless_ready DIR: exits 0 if the caller's `ready` says DIR is built,
# else takes DIR.lock (held until the script exits: concurrent runs wait)
# and checks again, since the run that held it may have built DIR.
lock_unless_ready() {
    ready && exit 0
    mkdir -p "$(dirname "$1")"
    exec 9>"$1.lock"
    flock 9
    ready && exit 0
    return 0
}

# debian_mirror: the Debian mirror apt uses on this machine.
debian_mirror() {
    local m
    m=$(grep -rhoE '^(URIs:|deb)[[:space:]]+https?://[^[:space:]]+/debian/?' /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null \
        | awk '{print $NF}' | head -n1 || true)
    echo "${m:-http://deb.debian.org/debian}"
}
