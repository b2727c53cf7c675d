#!/usr/bin/env bash
# demo.sh: the main job end to end on the embedded default. Mounts one krfs
# node (with its own meta service), writes its default region through
# regions/mem, reads it back as a peer would through peers/<gid>/mem with
# cat, does an atomic, sends itself a message, and unmounts.
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${KRFS_BIN:-$top/bin/krfs}
[ "$(id -u)" = 0 ] || { echo "demo.sh: run as root (FUSE)" >&2; exit 1; }
[ -x "$BIN" ] || (cd "$top" && go build -o "$BIN" ./cmd/krfs)
mnt=$(mktemp -d /tmp/krfs-demo.XXXXXX)
shm=$(mktemp -d /tmp/krfs-demo-shm.XXXXXX)
log=$mnt.log
"$BIN" mount "$mnt" --listen 127.0.0.1:4795 --gid 1 --mem-size 1M --shm-dir "$shm" >"$log" 2>&1 &
pid=$!
cleanup() { kill -INT $pid 2>/dev/null; wait $pid 2>/dev/null || true; rmdir "$mnt" 2>/dev/null; rm -rf "$shm" "$log"; }
trap cleanup EXIT
for _ in $(seq 1 50); do grep -q " $mnt fuse" /proc/self/mounts && break; sleep 0.1; done
grep -q " $mnt fuse" /proc/self/mounts || { cat "$log"; exit 1; }
set -x
ls "$mnt" "$mnt/peers"
printf 'hello from krfs' | dd of="$mnt/regions/mem" conv=notrunc status=none
head -c 15 "$mnt/peers/1/mem"; echo
"$BIN" atomic faa "$mnt/peers/1/mem" 64 41
"$BIN" atomic faa "$mnt/peers/1/mem" 64 1
cat "$mnt/peers/1/info"
touch "$mnt/ports/7"
printf 'a message' >"$mnt/peers/1/ports/7"
dd if="$mnt/ports/7" bs=64k count=1 status=none; echo   # one read() returns one message
