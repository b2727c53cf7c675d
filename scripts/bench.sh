#!/usr/bin/env bash
# scripts/bench.sh [OUTDIR] — krfs's comparison suite (`make bench`).
#
# Runs, on loopback and in one go, krfs beside the baselines it is judged
# against, all measured in this run (this machine's speed moves 2-4x
# between runs, so only same-run ratios mean anything):
#   - the Go benchmarks of softnic, meta and qpcore (each measures its own
#     baseline next to itself and reports ratios);
#   - `krfs bench` against a `krfs mount` this script starts (single node,
#     embedded meta service): Go API rows from a separate process, and FUSE
#     rows through the mounted files (needs root and /dev/fuse; skipped
#     otherwise).
# Then `krfs bench report` writes OUTDIR/results.json, OUTDIR/results.md
# (also printed) and SVG plots. Raw outputs stay in OUTDIR/raw.
#
# Environment: GO (go), QUICK=1 for a smoke run with few iterations,
# MESH=1 to add the full-mesh benchmarks (240 nodes and the sweep: about
# two more minutes, so not by default),
# CLUSTER=0 to leave out the rows across veth from a 2-host namespace cluster
# (scripts/cluster.sh with its own namespace prefix kbench-, so it does
# not disturb tests/e2e or another cluster; on by default when root, needs
# iproute2 and nsenter), ONLY=veth to run only those rows (about a minute:
# no Go benchmarks, no single-node mount).
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
OUT=${1:-bench-results}
RAW=$OUT/raw
rm -rf "$RAW"
mkdir -p "$RAW"
T0=$(date +%s)
log() { printf '[bench %3ds] %s\n' $(($(date +%s) - T0)) "$*" >&2; }

# Iterations: full run by default, QUICK=1 for a smoke test.
if [[ ${QUICK:-0} == 1 ]]; then
	LAT_N=300 VLAT_API_N=300 VLAT_FUSE_N=300 RATE_N=3000 BW_N=64 SWEEP_N=50 CONN_N=100 GB_LAT=2000x GB_RATE=20000x GB_BW=200x GB_CONN=200x GB_META=2000x MESH=0 RATE_D=1 FIO_S=4
else
	LAT_N=20000 VLAT_API_N=100000 VLAT_FUSE_N=50000 RATE_N=200000 BW_N=2000 SWEEP_N=1000 CONN_N=3000 GB_LAT=100000x GB_RATE=200000x GB_BW=2000x GB_CONN=2000x GB_META=20000x MESH=${MESH:-0} RATE_D=3 FIO_S=16
fi

log "building bin/krfs"
mkdir -p bin
$GO build -o bin/krfs ./cmd/krfs
KRFS=$PWD/bin/krfs
$GO build -o bin/krfs-baseline ./cmd/krfs-baseline
KBASE=$PWD/bin/krfs-baseline

# Go benchmarks, one at a time (with 2 vCPUs anything beside a
# measurement is part of it). Test binaries are built first so that
# compiling does not overlap the runs.
gobench() { # FILE PKG REGEXP BENCHTIME
	log "go test -bench '$3' -benchtime=$4 $2"
	$GO test -run=NONE -bench="$3" -benchtime="$4" -timeout=10m "$2" >"$RAW/$1.txt" 2>&1 ||
		{ log "FAILED: $2 $3 (see $RAW/$1.txt)"; }
}
if [[ ${ONLY:-} != veth ]]; then
	gobench softnic_lat ./verbs/softnic '^BenchmarkReadLatency8B$' $GB_LAT
	gobench softnic_rate ./verbs/softnic '^BenchmarkReadRate32$' $GB_RATE
	gobench softnic_bw ./verbs/softnic '^BenchmarkReadBandwidth1M$' $GB_BW
	gobench baseline_tcpconn ./bench/baseline '^BenchmarkTCPConnectRoundTrip$' 2000x
	gobench qpcore_connect ./qpcore '^BenchmarkQPCoreConnect$' $GB_CONN
	gobench qpcore_read ./qpcore '^BenchmarkQPCoreRead$' $GB_LAT
	gobench qpcore_memory ./qpcore '^BenchmarkQPCoreMemory$' 1x
	gobench meta_lookup ./meta '^BenchmarkMetaOneSidedVsRPC$' $GB_META
	gobench qpcore_elastic ./qpcore '^BenchmarkQPCoreElasticStart$' 3x
	if [[ $MESH == 1 ]]; then
		gobench qpcore_mesh ./qpcore '^BenchmarkQPCoreFullMesh240$' 1x
		gobench qpcore_mesh_sweep ./qpcore '^BenchmarkQPCoreFullMeshSweep$' 1x
	fi
fi

# krfs bench against a mount of our own.
MNT=$(mktemp -d /tmp/krfs-bench.XXXXXX)
MOUNT_PID=
CAT_PID=
CLUSTER_UP=
BASE_PIDS=
cleanup() {
	# Closing their stdin stops the veth baseline servers (krfs-baseline).
	exec 7>&- 8>&- 9>&-
	for p in $BASE_PIDS; do
		for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
		kill "$p" 2>/dev/null || true
	done
	BASE_PIDS=
	if grep -qs " $MNT/floor " /proc/self/mountinfo; then umount -l "$MNT/floor" 2>/dev/null || true; fi
	if [[ -n $CLUSTER_UP ]]; then
		KRFS_NS=kbench KRFS_DIR=$MNT/cluster scripts/cluster.sh down >/dev/null 2>&1 || true
		CLUSTER_UP=
	fi
	if [[ -n $CAT_PID ]]; then kill -- "-$CAT_PID" 2>/dev/null || kill "$CAT_PID" 2>/dev/null || true; fi
	if [[ -n $MOUNT_PID ]]; then
		kill "$MOUNT_PID" 2>/dev/null || true
		for _ in $(seq 50); do kill -0 "$MOUNT_PID" 2>/dev/null || break; sleep 0.1; done
	fi
	if grep -qs " $MNT/mnt " /proc/self/mountinfo; then umount -l "$MNT/mnt" 2>/dev/null || true; fi
	rm -rf "$MNT"
}
trap cleanup EXIT
mkdir -p "$MNT/mnt"

kb() { # NAME ARGS...: one krfs bench run, JSON kept in raw/NAME.json
	local name=$1
	shift
	log "krfs bench $*"
	if ! ${KB_PREFIX:-} "$KRFS" bench "$@" --json --progress off >"$RAW/$name.json" 2>"$RAW/$name.err"; then
		log "FAILED: krfs bench $* ($(tail -1 "$RAW/$name.err"))"
		rm -f "$RAW/$name.json"
	fi
}

if [[ ${ONLY:-} == veth ]]; then
	log "ONLY=veth: skipping the single-node rows"
elif [[ $(id -u) == 0 && -c /dev/fuse ]]; then
	log "mounting a single krfs node at $MNT/mnt"
	"$KRFS" mount "$MNT/mnt" --listen 127.0.0.1:0 --mem-size 4M --shm-dir "$MNT/shm" >"$RAW/mount.log" 2>&1 &
	MOUNT_PID=$!
	for _ in $(seq 100); do
		grep -q "krfs mounted" "$RAW/mount.log" 2>/dev/null && break
		kill -0 "$MOUNT_PID" 2>/dev/null || break
		sleep 0.1
	done
	ADDR=$(sed -n 's/.*address="\{0,1\}\([0-9.]*:[0-9]*\).*/\1/p' "$RAW/mount.log" | head -1)
	GID=$(sed -n 's/.* gid=\([0-9]*\).*/\1/p' "$RAW/mount.log" | head -1)
	if [[ -z $ADDR || -z $GID ]]; then
		log "krfs mount failed:"
		cat "$RAW/mount.log" >&2
	else
		API=(--meta "$ADDR" --gid "$GID")
		FILE=(--path "$MNT/mnt/peers/$GID/mem")
		kb api_read_lat8 read_lat -s 8 -n $LAT_N --baseline "${API[@]}"
		kb fuse_read_lat8 read_lat -s 8 -n $LAT_N --baseline "${FILE[@]}"
		kb fuse_noop_lat8 fuse_noop_lat -s 8 -n $LAT_N --baseline
		kb api_write_lat8 write_lat -s 8 -n $LAT_N --baseline "${API[@]}"
		kb fuse_write_lat8 write_lat -s 8 -n $LAT_N --baseline "${FILE[@]}"
		kb api_atomic_lat atomic_lat -n $LAT_N --baseline "${API[@]}"
		kb fuse_atomic_lat atomic_lat -n $LAT_N --baseline "${FILE[@]}"
		kb api_rate32 read_bw -s 8 -t 32 -n $RATE_N --baseline "${API[@]}"
		kb fuse_rate32 read_bw -s 8 -t 32 -n $((RATE_N / 5)) --baseline "${FILE[@]}"
		kb api_hybrid_dc read_bw -s 8 -t 32 -n $RATE_N --transport dc "${API[@]}"
		kb api_hybrid_rc read_bw -s 8 -t 32 -n $RATE_N --transport rc "${API[@]}"
		kb api_bw1m read_bw -s 1M -t 4 -n $BW_N --baseline "${API[@]}"
		kb fuse_bw1m read_bw -s 1M -t 4 -n $BW_N --baseline "${FILE[@]}"
		kb api_connect connect -n $CONN_N --baseline "${API[@]}"
		kb fuse_connect connect -n $CONN_N --baseline "${FILE[@]}"
		kb api_meta_lookup meta_lookup -n $CONN_N "${API[@]}"
		# SEND: a reader drains port 7 of the node (each read is one
		# message). A port reads as end of file once its queue is empty, so
		# cat exits then: read again until the port goes away. setsid: the
		# loop and its cat are one process group, killed together.
		if touch "$MNT/mnt/ports/7"; then
			setsid bash -c 'while cat "$1"; do :; done' drain "$MNT/mnt/ports/7" >/dev/null 2>&1 &
			CAT_PID=$!
			kb api_send_lat send_lat -s 64 -n $LAT_N --port 7 --baseline "${API[@]}"
			kb fuse_send_lat send_lat -s 64 -n $LAT_N --baseline --path "$MNT/mnt/peers/$GID/ports/7"
		fi
		kb api_sweep read_lat -a -n $SWEEP_N --baseline "${API[@]}"
		kb fuse_sweep read_lat -a -n $SWEEP_N "${FILE[@]}"
		kb fuse_noop_sweep fuse_noop_lat -a -n $SWEEP_N
	fi
else
	log "not root or no /dev/fuse: skipping the rows that need a mount"
fi

# fragcreates NS: Ip FragCreates of namespace NS (/proc/net/snmp is per
# network namespace).
fragcreates() {
	nsenter --net="/run/netns/$1" awk '/^Ip:/ { if (!h) { for (i = 1; i <= NF; i++) if ($i == "FragCreates") c = i; h = 1 } else print $c }' /proc/net/snmp
}

# waitline FILE: waits until FILE has a line (a helper printed its address).
waitline() {
	for _ in $(seq 100); do
		[[ -s $1 ]] && return 0
		sleep 0.1
	done
	return 1
}

# veth_rows: the rows across the veth of a 2-host cluster, each beside a
# baseline on the same veth: host 1 (kbench-h1, $NET.1) reads host 2's
# memory; the baselines' servers run on host 2 (UDP echo, TCP) and on
# host 1 (the FUSE floor, a go-fuse server in its own process whose every
# read is one UDP round trip to host 2). Extra figures go to raw/extra.kv
# ("key value" lines).
veth_rows() {
	local net=${KRFS_NET:-10.77.0} h1="nsenter --net=/run/netns/kbench-h1" h2="nsenter --net=/run/netns/kbench-h2"
	local kv=$RAW/extra.kv g2 udp tcp floor ns
	for ns in h1 h2 meta; do echo "frag_before_$ns $(fragcreates kbench-$ns)" >>"$kv"; done
	g2=$(sed -n 's/.* gid=\([0-9]*\).*/\1/p' "$MNT/cluster/h2.log" | head -1)
	local capi=(--meta "$net.254:4790" --gid "$g2" --listen "$net.1:0")
	local cfile=(--path "$MNT/cluster/h1/peers/$g2/mem")
	mkfifo "$MNT/srv.in" "$MNT/floor.in"
	$h2 "$KBASE" serve -addr "$net.2" <"$MNT/srv.in" >"$MNT/srv.out" 2>"$RAW/veth_srv.err" &
	BASE_PIDS="$BASE_PIDS $!"
	exec 7>"$MNT/srv.in"
	if ! waitline "$MNT/srv.out"; then
		log "veth baseline server did not start (see $RAW/veth_srv.err)"
		return
	fi
	udp=$(sed -n 's/.*udp=\([^ ]*\).*/\1/p' "$MNT/srv.out")
	# An echo on the meta service's host too: the cold connect's floor
	# (one round trip there, then one to host 2's echo).
	local mudp=
	mkfifo "$MNT/msrv.in"
	nsenter --net=/run/netns/kbench-meta "$KBASE" serve -addr "$net.254" <"$MNT/msrv.in" >"$MNT/msrv.out" 2>"$RAW/veth_msrv.err" &
	BASE_PIDS="$BASE_PIDS $!"
	exec 9>"$MNT/msrv.in"
	if waitline "$MNT/msrv.out"; then
		mudp=$(sed -n 's/.*udp=\([^ ]*\).*/\1/p' "$MNT/msrv.out")
	else
		log "meta host's baseline echo did not start (see $RAW/veth_msrv.err)"
	fi
	tcp=$(sed -n 's/.*tcp=\([^ ]*\).*/\1/p' "$MNT/srv.out")
	mkdir -p "$MNT/floor"
	$h1 "$KBASE" floor -dir "$MNT/floor" -addr "$net.1" -to "$udp" <"$MNT/floor.in" >"$MNT/floor.out" 2>"$RAW/veth_floor.err" &
	BASE_PIDS="$BASE_PIDS $!"
	exec 8>"$MNT/floor.in"
	waitline "$MNT/floor.out" || log "FUSE floor did not mount (see $RAW/veth_floor.err)"
	floor=$(sed -n 's/^path=//p' "$MNT/floor.out")
	base() { # NAME ARGS...: one krfs-baseline measurement, JSON in raw/NAME.json
		local name=$1
		shift
		log "krfs-baseline $*"
		if ! "$@" >"$RAW/$name.json" 2>"$RAW/$name.err"; then
			log "FAILED: $* ($(tail -1 "$RAW/$name.err"))"
			rm -f "$RAW/$name.json"
		fi
	}
	# Latency: krfs bench measures the baseline itself, in chunks between
	# chunks of its own operations (10 of each), so that the machine's
	# drift between two blocks does not move the ratio: the ping-pong to
	# host 2's echo (--baseline-echo), preads of the floor's file
	# (--baseline-floor). The rate and bandwidth rows pair a krfs run with a
	# krfs-baseline run right before it (the TCP one once before each 1 MiB
	# row). The latency rows run more operations than the loopback ones
	# (VLAT_*_N): across the veth a round trip is bimodal on a VM, and which
	# mode a pair of threads gets lasts for seconds, so a ratio of medians
	# needs seconds of each side (see baseline.AlternateWith).
	KB_PREFIX=$h1 kb veth_api_read_lat8 read_lat -s 8 -n $VLAT_API_N --baseline-echo "$udp" "${capi[@]}"
	if [[ -n $mudp ]]; then
		KB_PREFIX=$h1 kb veth_api_connect connect -n $CONN_N --baseline-echo "$udp" --baseline-meta-echo "$mudp" "${capi[@]}"
	fi
	if [[ -n $floor ]]; then
		kb veth_fuse_read_lat8 read_lat -s 8 -n $VLAT_FUSE_N --baseline-floor "$floor" "${cfile[@]}"
	fi
	if [[ -n $floor ]]; then
		base veth_base_floor_rate32 "$KBASE" prate -path "$floor" -t 32 -s 8 -d ${RATE_D}s
	fi
	kb veth_fuse_rate32 read_bw -s 8 -t 32 -D $RATE_D "${cfile[@]}"
	base veth_base_tcp1m $h1 "$KBASE" tcp -to "$tcp" -depth 4 -total $((BW_N << 20))
	KB_PREFIX=$h1 kb veth_api_bw1m read_bw -s 1M -t 4 -n $BW_N "${capi[@]}"
	base veth_base_tcp1m_fuse $h1 "$KBASE" tcp -to "$tcp" -depth 4 -total $((BW_N << 20))
	kb veth_fuse_bw1m read_bw -s 1M -t 4 -n $BW_N "${cfile[@]}"
	# WRITEs of 1 MiB: a WRITE into an exported region is received into a
	# private buffer and copied after its header is checked (softnic's
	# no-foreign-byte rule), so these rows show what that copy costs.
	base veth_base_tcp1m_w $h1 "$KBASE" tcp -to "$tcp" -depth 4 -total $((BW_N << 20))
	KB_PREFIX=$h1 kb veth_api_wbw1m write_bw -s 1M -t 4 -n $BW_N "${capi[@]}"
	kb veth_fuse_wbw1m write_bw -s 1M -t 4 -n $BW_N "${cfile[@]}"
	# FUSE transports: the rows above use the cluster's mount, which
	# bench's cluster mounts with --fuse-transport auto (FUSE over io_uring
	# when the kernel offers it). Its 8 B pread against the raw round trip,
	# then a second daemon on host 1 mounted with --fuse-transport dev
	# (go-fuse's /dev/fuse loop) for the same rows,
	# right after, on the same veth.
	KB_PREFIX=$h1 kb veth_fuse_read_lat8_udp read_lat -s 8 -n $VLAT_FUSE_N --baseline-echo "$udp" "${cfile[@]}"
	local dmnt=$MNT/h1dev dpid ok=
	mkdir -p "$dmnt"
	$h1 "$KRFS" mount "$dmnt" --meta "$net.254:4790" --listen "$net.1:0" --mem-size 4M \
		--shm-dir "$MNT/shm-h1dev" --fuse-transport dev >"$RAW/veth_dev_mount.log" 2>&1 &
	dpid=$!
	for _ in $(seq 100); do
		if [[ -e $dmnt/peers/$g2/mem ]]; then ok=1; break; fi
		kill -0 "$dpid" 2>/dev/null || break
		sleep 0.1
	done
	if [[ -n $ok ]]; then
		local dfile=(--path "$dmnt/peers/$g2/mem")
		KB_PREFIX=$h1 kb veth_dev_fuse_read_lat8_udp read_lat -s 8 -n $VLAT_FUSE_N --baseline-echo "$udp" "${dfile[@]}"
		kb veth_dev_fuse_rate32 read_bw -s 8 -t 32 -D $RATE_D "${dfile[@]}"
		kb veth_fuse_rate32_b read_bw -s 8 -t 32 -D $RATE_D "${cfile[@]}"
		kb veth_dev_fuse_bw1m read_bw -s 1M -t 4 -n $BW_N "${dfile[@]}"
	else
		log "the dev-transport mount did not come up (see $RAW/veth_dev_mount.log)"
	fi
	kill -INT "$dpid" 2>/dev/null || true
	wait "$dpid" 2>/dev/null || true
	# Memory: fio through host 1's file of host 2's memory, then host 1's
	# daemon's own (anonymous) memory.
	if command -v fio >/dev/null; then
		log "fio randrw, 4 jobs, bsrange 512-1M, ${FIO_S}s on ${cfile[1]}"
		# timeout: a krfs operation that never completes must not hang the
		# suite. continue_on_error: a failed I/O is counted (raw/veth_fio.log,
		# extra.kv fio_rc) and the load goes on for the whole run.
		local rc=0
		timeout -s KILL $((FIO_S + 60)) fio --name=krfs --filename="${cfile[1]}" --rw=randrw --numjobs=4 --bsrange=512-1M --size=4M \
			--ioengine=psync --time_based --runtime=$FIO_S --continue_on_error=all --group_reporting >"$RAW/veth_fio.log" 2>&1 || rc=$?
		[[ $rc == 0 ]] || log "fio exited with $rc (see $RAW/veth_fio.log)"
		echo "fio_rc $rc" >>"$kv"
		echo "fio_rssanon_kib $(awk '/^RssAnon:/ { print $2 }' "/proc/$(cat "$MNT/cluster/h1.pid")/status")" >>"$kv"
	else
		log "fio not installed (apt-get install fio): no memory row"
	fi
	for ns in h1 h2 meta; do echo "frag_after_$ns $(fragcreates kbench-$ns)" >>"$kv"; done
}

if [[ ${CLUSTER:-1} == 1 && $(id -u) == 0 ]] && command -v ip >/dev/null && command -v nsenter >/dev/null; then
	if [[ -e /run/netns/kbench-sw ]]; then
		log "a namespace cluster is already up: skipping the veth rows"
	else
		log "scripts/cluster.sh up 2 (veth rows)"
		CLUSTER_UP=1
		if KRFS_NS=kbench KRFS_MOUNT_FLAGS="--fuse-transport auto ${KRFS_MOUNT_FLAGS:-}" KRFS_BIN=$KRFS KRFS_DIR=$MNT/cluster KRFS_MEM=4M scripts/cluster.sh up 2 >"$RAW/cluster.log" 2>&1; then
			veth_rows
		else
			log "cluster.sh up failed (see $RAW/cluster.log)"
		fi
	fi
fi
cleanup
trap - EXIT

log "writing $OUT/results.{json,md} and plots"
"$KRFS" bench report "$OUT"
log "done in $(($(date +%s) - T0)) s"
