#!/usr/bin/env bash
# cluster.sh: a local krfs cluster on one machine.
#
#   scripts/cluster.sh up N     a meta service and N hosts, each in its own
#                               network namespace, joined by veth pairs to a
#                               bridge; one `krfs mount` per host. Prints the
#                               mount directory of every host.
#   scripts/cluster.sh down     stops the daemons, unmounts, and removes the
#                               namespaces, links and directories.
#   scripts/cluster.sh restart I    restarts host I's daemon (same gid, same
#                               region files), as after a crash.
#   scripts/cluster.sh restart-meta restarts the meta service.
#   scripts/cluster.sh status   lists what is running.
#
# Environment: KRFS_BIN (default bin/krfs, built if missing), KRFS_DIR (state
# and mounts, default /run/krfs-cluster), KRFS_NET (the /24 used inside the
# namespaces, default 10.77.0), KRFS_MEM (default region size, 16M).
# KRFS_NS (namespace prefix, default krfs) keeps clusters apart: hosts are
# namespaces $KRFS_NS-h1..N at $KRFS_NET.1..N, the meta service is
# $KRFS_NS-meta at $KRFS_NET.254, the bridge lives in $KRFS_NS-sw, and
# `down` removes only that prefix's namespaces. The
# daemons are started with `nsenter --net` (not `ip netns exec`, which would
# hide their FUSE mounts in a private mount namespace). KRFS_MOUNT_FLAGS and
# KRFS_META_FLAGS add flags to every `krfs mount` and to `krfs meta` (for
# example KRFS_MOUNT_FLAGS="--log-level debug --timeout 5s").
#
# Up to 200 hosts. Above 16 hosts, `up` raises the host-wide ARP table
# limits (net.ipv4.neigh.default.gc_thresh2/3, shared by every namespace)
# so that a full mesh does not overflow it. On a busy 2-vCPU machine with
# KRFS_MEM=1M, 32 hosts came up in 8-12 s and 64 in 18 s (most of it the
# daemons starting at once); each daemon showed about 15 MiB of RSS, much
# of it the shared binary: the machine's available memory fell by 5-8 MiB
# per daemon at 32 hosts and 3.6 MiB at 64 (scripts/mesh.sh measures both).
set -euo pipefail

top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${KRFS_BIN:-$top/bin/krfs}
DIR=${KRFS_DIR:-/run/krfs-cluster}
NS=${KRFS_NS:-krfs}
NET=${KRFS_NET:-10.77.0}
MEM=${KRFS_MEM:-16M}
META_PORT=4790
PORT=4791

die() { echo "cluster.sh: $*" >&2; exit 1; }

need_root() { [ "$(id -u)" = 0 ] || die "must run as root (namespaces, FUSE)"; }

# Daemons are started with nsenter directly (not through a shell
# function), so that $! is the daemon's own pid.
build() {
	if [ ! -x "$BIN" ]; then
		echo "building $BIN"
		(cd "$top" && go build -o "$BIN" ./cmd/krfs)
	fi
}

# link NS ADDR: a veth pair from namespace NS (eth0 with ADDR) to the bridge.
link() {
	local ns=$1 addr=$2 peer="v-${1##*-}"
	ip netns add "$ns"
	# Created inside the switch namespace, so that no name is ever taken in
	# the root namespace and clusters with other prefixes cannot collide.
	ip -n "$NS-sw" link add "$peer" type veth peer name eth0 netns "$ns"
	ip -n "$NS-sw" link set "$peer" master br0 up
	ip -n "$ns" addr add "$addr/24" dev eth0
	ip -n "$ns" link set eth0 up
	ip -n "$ns" link set lo up
}

# A daemon mounts in well under a second on an idle machine; 64 daemons
# starting at once on 2 vCPUs take longer, hence 30 s by default
# (KRFS_UP_WAIT, in seconds: the tests, run beside other work, give minutes).
# A daemon that exits is reported at once.
wait_mounted() {
	local mnt=$1 log=$2 pid=${3:-}
	local end=$((SECONDS + ${KRFS_UP_WAIT:-30}))
	while [ "$SECONDS" -lt "$end" ]; do
		if grep -q " $mnt fuse" /proc/self/mounts 2>/dev/null; then return 0; fi
		if [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null; then break; fi
		sleep 0.1
	done
	echo "--- $log" >&2; tail -n 20 "$log" >&2 || true
	die "$mnt did not come up"
}

start_host() {
	local i=$1 mnt="$DIR/h$1"
	# A crashed host leaves a stale mount (ENOTCONN) that mkdir cannot
	# stat; the daemon cleans it up itself.
	mkdir -p "$mnt" 2>/dev/null || true
	nsenter --net="/run/netns/$NS-h$i" "$BIN" mount "$mnt" --meta "$NET.254:$META_PORT" --listen "$NET.$i:$PORT" \
		--gid "$i" --mem-size "$MEM" --shm-dir "$DIR/shm-h$i" ${KRFS_MOUNT_FLAGS:-} >>"$DIR/h$i.log" 2>&1 &
	echo $! >"$DIR/h$i.pid"
}

start_meta() {
	nsenter --net=/run/netns/$NS-meta "$BIN" meta --listen "$NET.254:$META_PORT" ${KRFS_META_FLAGS:-} >>"$DIR/meta.log" 2>&1 &
	echo $! >"$DIR/meta.pid"
}

stop_pid() {
	local f=$1
	[ -e "$f" ] || return 0
	local p; p=$(cat "$f")
	kill "$p" 2>/dev/null || true
	for _ in $(seq 1 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
	kill -9 "$p" 2>/dev/null || true
	rm -f "$f"
}

restart() {
	local i=${1:?restart I}
	need_root
	stop_pid "$DIR/h$i.pid"
	start_host "$i"
	wait_mounted "$DIR/h$i" "$DIR/h$i.log" "$(cat "$DIR/h$i.pid")"
	echo "host $i ($NET.$i, gid $i): $DIR/h$i"
}

restart_meta() {
	need_root
	stop_pid "$DIR/meta.pid"
	start_meta
}

# raise_neigh N: the kernel's neighbour (ARP) table is one table for all
# network namespaces, capped by net.ipv4.neigh.default.gc_thresh3 (1024 by
# default). A full mesh of N hosts holds about N*(N+1) entries, so 32 hosts
# already overflow it ("neighbor table overflow!" in dmesg): ARP fails,
# packets are dropped and peers look unreachable. Raise the thresholds for
# the mesh (only ever raise them; they are host-wide).
raise_neigh() {
	local n=$1 want2 want3 cur
	want3=$(((n + 2) * (n + 2) * 2 + 2048))
	want2=$((want3 / 2))
	for k in 2 3; do
		local want=$want3
		[ $k = 2 ] && want=$want2
		cur=$(sysctl -n net.ipv4.neigh.default.gc_thresh$k 2>/dev/null || echo 0)
		if [ "$cur" -lt "$want" ]; then
			sysctl -qw net.ipv4.neigh.default.gc_thresh$k="$want" || echo "cluster.sh: could not raise gc_thresh$k to $want" >&2
		fi
	done
}

up() {
	local n=${1:-3}
	[[ $n =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le 200 ] || die "up N: N from 1 to 200"
	need_root
	[ -e /run/netns/$NS-sw ] && die "a cluster is already up (scripts/cluster.sh down first)"
	build
	[ "$n" -le 16 ] || raise_neigh "$n"
	mkdir -p "$DIR"
	ip netns add $NS-sw
	ip -n $NS-sw link add br0 type bridge
	ip -n $NS-sw link set br0 up
	ip -n $NS-sw link set lo up
	link $NS-meta "$NET.254"
	start_meta
	for i in $(seq 1 "$n"); do
		link "$NS-h$i" "$NET.$i"
	done
	sleep 0.2
	for i in $(seq 1 "$n"); do
		start_host "$i"
	done
	for i in $(seq 1 "$n"); do
		wait_mounted "$DIR/h$i" "$DIR/h$i.log" "$(cat "$DIR/h$i.pid")"
		echo "host $i ($NET.$i, gid $i): $DIR/h$i"
	done
}

down() {
	need_root
	for p in "$DIR"/*.pid; do
		[ -e "$p" ] || continue
		kill "$(cat "$p")" 2>/dev/null || true
	done
	sleep 0.3
	for p in "$DIR"/*.pid; do
		[ -e "$p" ] || continue
		kill -9 "$(cat "$p")" 2>/dev/null || true
		rm -f "$p"
	done
	for m in "$DIR"/h*; do
		[ -d "$m" ] || continue
		umount -l "$m" 2>/dev/null || true
	done
	for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^$NS-" || true); do
		ip netns del "$ns" 2>/dev/null || true
	done
	rm -rf "$DIR"
}

status() {
	ip netns list 2>/dev/null | grep "^$NS-" || echo "no cluster namespaces"
	grep " $DIR/" /proc/self/mounts 2>/dev/null || true
}

case "${1:-}" in
up) shift; up "$@" ;;
down) down ;;
restart) shift; restart "$@" ;;
restart-meta) restart_meta ;;
status) status ;;
*) sed -n '2,33p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
