#!/usr/bin/env bash
# demo.sh: the main job end to end on one node with the embedded meta
# service. Mounts a krfs node, writes its default region through
# regions/mem, reads it back as a peer would through peers/<gid>/mem,
# does two atomics, sends itself a message, unmounts, and says whether
# everything worked. Each command is printed with "$ " before its output.
#
# Environment: KRFS_BIN (default bin/krfs, which `make demo` builds),
# KRFS_DEMO_LISTEN (the node's address, default 127.0.0.1:4795).
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${KRFS_BIN:-$top/bin/krfs}
LISTEN=${KRFS_DEMO_LISTEN:-127.0.0.1:4795}
[ "$(id -u)" = 0 ] || { echo "demo: run as root (krfs mounts FUSE)" >&2; exit 1; }
[ -x "$BIN" ] || { echo "demo: $BIN is missing: run make build (or make demo)" >&2; exit 1; }

mnt=$(mktemp -d /tmp/krfs-demo.XXXXXX)
shm=$(mktemp -d /tmp/krfs-demo-shm.XXXXXX)
log=$mnt.log
step=setup
pid=
cleanup() {
	rc=$?
	if [ -n "$pid" ]; then kill -INT "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
	if [ "$rc" != 0 ]; then
		echo
		echo "demo: FAILED at: $step (exit $rc)"
		[ -s "$log" ] && { echo "--- krfs mount log:"; cat "$log"; }
	fi
	rmdir "$mnt" 2>/dev/null || true
	rm -rf "$shm" "$log"
	exit "$rc"
}
trap cleanup EXIT

# run CMD...: prints "$ CMD" and runs it; its output follows.
run() {
	step="$*"
	printf '$ %s\n' "$*"
	"$@"
}

echo "demo: krfs mount stays in the foreground until the filesystem is unmounted"
echo "demo: (or it gets Ctrl-C); this demo runs it in the background with '&'."
echo "demo: (krfs mount --daemon detaches instead.) Its log: $log"
echo
printf '$ %s mount %s --listen %s --mem-size 1M --shm-dir %s &\n' "$BIN" "$mnt" "$LISTEN" "$shm"
"$BIN" mount "$mnt" --listen "$LISTEN" --mem-size 1M --shm-dir "$shm" >"$log" 2>&1 &
pid=$!
step="waiting for the mount"
for _ in $(seq 1 100); do
	grep -q " $mnt fuse" /proc/self/mounts && break
	kill -0 "$pid" 2>/dev/null || { wait "$pid"; exit 1; }
	sleep 0.1
done
grep -q " $mnt fuse" /proc/self/mounts

run ls "$mnt" "$mnt/peers"
me=$(ls "$mnt/peers" | head -1)
echo "# this node's gid (assigned by its meta service): $me"
step="write regions/mem"
printf '$ printf %q | dd of=%s conv=notrunc status=none\n' 'hello from krfs' "$mnt/regions/mem"
printf 'hello from krfs' | dd of="$mnt/regions/mem" conv=notrunc status=none
step="read peers/$me/mem"
printf '$ head -c 15 %s\n' "$mnt/peers/$me/mem"
got=$(head -c 15 "$mnt/peers/$me/mem")
echo "$got"
[ "$got" = "hello from krfs" ]
run "$BIN" atomic faa "$mnt/peers/$me/mem" 64 41
step="second atomic"
printf '$ %s atomic faa %s 64 1\n' "$BIN" "$mnt/peers/$me/mem"
old=$("$BIN" atomic faa "$mnt/peers/$me/mem" 64 1)
echo "$old"
[ "$old" = 41 ]
run cat "$mnt/peers/$me/info"
run touch "$mnt/ports/7"
step="send to port 7"
printf '$ printf %q > %s\n' 'a message' "$mnt/peers/$me/ports/7"
printf 'a message' >"$mnt/peers/$me/ports/7"
step="receive on port 7"
printf '$ dd if=%s bs=64k count=1 status=none   # one read() returns one message\n' "$mnt/ports/7"
msg=$(dd if="$mnt/ports/7" bs=64k count=1 status=none)
echo "$msg"
[ "$msg" = "a message" ]
run umount "$mnt"
step="the daemon exiting after umount"
wait "$pid"
pid=
echo
echo "demo: OK: wrote local memory, read it back by RDMA READ, two atomics, one message, unmounted."
echo "demo: the binary is $BIN (make install copies it to /usr/local/bin; make clean removes bin/)."
