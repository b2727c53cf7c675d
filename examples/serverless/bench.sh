#!/usr/bin/env bash
# bench.sh: the serverless hand-off latency table, krfs ports against TCP,
# measured in one run on a 2-host namespace cluster of its own.
#
#   examples/serverless/bench.sh            sizes 16 KiB .. 64 MiB, 5 runs each
#   REPS=3 SIZES="16384 1048576" examples/serverless/bench.sh
#
# Host 1 runs the producer, host 2 the consumer; every run starts two fresh
# processes (the consumer first, which binds its ports, then the producer).
# krfs hands objects below 64 KiB over as port messages and larger ones
# through a region of host 1's hand-off pool that the consumer READs
# (handoff.py --via auto; the first run of each size class makes the
# pool's region, later runs reuse it); VIA=ports, VIA=region (a new
# region per hand-off) or VIA=pool forces one way for every size.
# Hand-off = consumer holds the whole object - producer starts sending;
# acked = producer got the consumer's digest back - producer starts sending.
# Every run checks the SHA-256 on both sides; one mismatch fails the script.
# Environment: KRFS_NS, KRFS_NET, KRFS_DIR, KRFS_MOUNT_FLAGS (e.g.
# "--fuse-transport dev": BENCHMARKS.md compares the transports) as for scripts/cluster.sh
# (defaults keep this cluster apart from others), REPS, SIZES, OUT (raw
# JSON lines; default a temporary file).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
top=$(cd "$here/../.." && pwd)
# KRFS_DIR holds the daemons' region stores (DIR/shm-hN), which must be a
# tmpfs as in production: /dev/shm by default (/run is not one everywhere).
export KRFS_NS=${KRFS_NS:-ksl$$} KRFS_NET=${KRFS_NET:-10.93.0} KRFS_DIR=${KRFS_DIR:-/dev/shm/krfs-sl$$} KRFS_MEM=${KRFS_MEM:-4M}
REPS=${REPS:-5}
VIA=${VIA:-auto}
SIZES=${SIZES:-"16384 65536 262144 1048576 4194304 16777216 67108864"}
OUT=${OUT:-$(mktemp /tmp/handoff.XXXXXX.jsonl)}
# The interpreter itself, not a wrapper (a pyenv shim adds ~0.3 s per start).
PY=${PYTHON:-$(python3 -c 'import sys; print(sys.executable)')}
py="$PY $here/handoff.py"

trap '"$top/scripts/cluster.sh" down >/dev/null 2>&1 || true' EXIT
"$top/scripts/cluster.sh" up 2 >/dev/null
M1=$KRFS_DIR/h1 M2=$KRFS_DIR/h2
in_host() { local h=$1; shift; nsenter --net="/run/netns/$KRFS_NS-h$h" "$@"; }
# Both daemons are up; wait until each sees the other in the meta service.
for _ in $(seq 1 100); do
	[ -e "$M1/peers/2/info" ] && [ -e "$M2/peers/1/info" ] && break
	sleep 0.05
done

# wait_ready FILE: the consumer printed its ready line.
wait_ready() {
	for _ in $(seq 1 200); do
		grep -q ready "$1" 2>/dev/null && return 0
		sleep 0.02
	done
	echo "bench.sh: consumer did not start: $(cat "$1")" >&2
	exit 1
}

: >"$OUT"
tmp=$(mktemp -d)
for s in $SIZES; do
	for r in $(seq 1 "$REPS"); do
		# krfs ports (the file is emptied here, not by the background
		# job's redirection, which may come after wait_ready looked)
		: >"$tmp/recv"
		in_host 2 $py recv --mount "$M2" --port 100 ${RECV_FLAGS:-} >"$tmp/recv" &
		rp=$!
		wait_ready "$tmp/recv"
		in_host 1 $py send --mount "$M1" --to 2 --port 100 --reply 99 --size "$s" --via "$VIA" \
			--shm-dir "$KRFS_DIR/shm-h1" >>"$OUT"
		wait $rp
		grep -v ready "$tmp/recv" >>"$OUT"
		# TCP
		: >"$tmp/recv"
		in_host 2 $py tcprecv --bind "$KRFS_NET.2" --port 7100 >"$tmp/recv" &
		rp=$!
		wait_ready "$tmp/recv"
		in_host 1 $py tcpsend --to "$KRFS_NET.2" --port 7100 --size "$s" >>"$OUT"
		wait $rp
		grep -v ready "$tmp/recv" >>"$OUT"
	done
done
rm -rf "$tmp"

python3 - "$OUT" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
sends = [r for r in rows if r["side"] == "send"]
recvs = [r for r in rows if r["side"] == "recv"]
if len(sends) != len(recvs):
    sys.exit("unpaired runs")
res = {}
for s, r in zip(sends, recvs):
    assert s["mode"] == r["mode"] and s["bytes"] == r["bytes"]
    if not s["identical"] or s["sha256"] != r["sha256"]:
        sys.exit("object not byte-identical: %s" % s)
    d = res.setdefault((s["bytes"], s["mode"]), {"h": [], "a": [], "chunks": s["chunks"], "via": s.get("via", "")})
    d["h"].append((r["t_done"] - s["t_start"]) / 1e3)
    d["a"].append((s["t_acked"] - s["t_start"]) / 1e3)
med = statistics.median
def size(n):
    return "%d MiB" % (n >> 20) if n >= 1 << 20 else "%d KiB" % (n >> 10)
print("| object | krfs via | messages | krfs hand-off p50 us | TCP hand-off p50 us | krfs / TCP | krfs acked p50 us | TCP acked p50 us | runs |")
print("|---:|---|---:|---:|---:|---:|---:|---:|---:|")
for b in sorted({k[0] for k in res}):
    k, t = res[(b, "krfs")], res[(b, "tcp")]
    print("| %s | %s | %d | %.0f | %.0f | %.2fx | %.0f | %.0f | %d |" % (size(b), k["via"], k["chunks"], med(k["h"]), med(t["h"]),
          med(k["h"]) / med(t["h"]), med(k["a"]), med(t["a"]), len(k["h"])))
print("all %d hand-offs byte-identical (SHA-256 checked on both sides)" % len(sends))
EOF
echo "raw: $OUT"
