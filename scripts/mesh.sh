#!/usr/bin/env bash
# mesh.sh: a full mesh of real krfs daemons on this machine.
#
#   scripts/mesh.sh N          N hosts (2..253; 32 and 64 are the reported sizes)
#
# Brings up N daemons with scripts/cluster.sh (timed; the memory they take
# is summed from their RSS and from the machine's available memory), then,
# in one run:
#   alone      5 cold pairs one at a time: open peers/G/mem + pread 8 B +
#              close on a host whose daemon never reached G (the reference)
#   files      every host at once (a mesh-reach.py process in each
#              namespace, started together): reach every other host
#              through its files, cold; then the same mesh again, warm
#   tcp        every host at once: TCP connect + one 8-byte request/reply
#              + close to every other host (a mesh-reach.py server in
#              each namespace)
#   api        `krfs bench fullmesh` in every namespace at once: a fresh
#              in-process krfs node reaching all N daemons (cold connect +
#              8-byte READ each, 3 iterations), and once alone
# and prints a table; raw JSON lines go to OUT. START=gate (default) starts
# every host's mesh at the same instant; START=staggered lets each start as
# soon as its process is up (spread over the processes' start-up time).
# Environment: KRFS_NS,
# KRFS_NET, KRFS_DIR, KRFS_MEM as for cluster.sh (defaults keep this
# cluster apart from others: namespaces kmesh$$-*, 10.92.0.0/24, MEM 1M).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
top=$(cd "$here/.." && pwd)
N=${1:?usage: scripts/mesh.sh N}
[[ $N =~ ^[0-9]+$ ]] && [ "$N" -ge 2 ] && [ "$N" -le 253 ] || { echo "mesh.sh: N from 2 to 253" >&2; exit 2; }
export KRFS_NS=${KRFS_NS:-kmesh$$} KRFS_NET=${KRFS_NET:-10.92.0} KRFS_DIR=${KRFS_DIR:-/run/krfs-mesh$$} KRFS_MEM=${KRFS_MEM:-1M}
OUT=${OUT:-$(mktemp /tmp/mesh.XXXXXX.jsonl)}
START=${START:-gate}
BIN=${KRFS_BIN:-$top/bin/krfs}
# The interpreter itself, not a wrapper (a pyenv shim adds ~0.3 s per start).
PY=${PYTHON:-$(python3 -c 'import sys; print(sys.executable)')}
reach="$PY $here/mesh-reach.py"
[ -x "$BIN" ] || (cd "$top" && go build -o "$BIN" ./cmd/krfs)

servers=()
cleanup() {
	for p in "${servers[@]}"; do kill "$p" 2>/dev/null || true; done
	"$here/cluster.sh" down >/dev/null 2>&1 || true
}
trap cleanup EXIT
in_host() { local h=$1; shift; nsenter --net="/run/netns/$KRFS_NS-h$h" "$@"; }
avail_kib() { awk '/^MemAvailable:/ {print $2}' /proc/meminfo; }
# Host I reaches I+1, I+2, ..., N, 1, ..., I-1: at any moment each host
# serves about one other. (Every host starting with host 1 would make an
# incast of N-1 cold requests on one daemon and on the meta entries of one
# neighbourhood, then on host 2, ...)
peers_of() { { seq $(($1 + 1)) "$N"; seq 1 $(($1 - 1)); } | paste -sd, -; }
ips_of() { peers_of "$1" | tr , '\n' | sed "s/^/$KRFS_NET./" | paste -sd, -; }

: >"$OUT"
a0=$(avail_kib)
t0=$(date +%s%N)
"$here/cluster.sh" up "$N" >/dev/null
t1=$(date +%s%N)
sleep "${SETTLE:-$((2 + N / 8))}" # let the daemons settle (first heartbeats) before memory is read
a1=$(avail_kib)
rss=0
for f in "$KRFS_DIR"/h*.pid "$KRFS_DIR"/meta.pid; do
	r=$(awk '/^VmRSS:/ {print $2}' "/proc/$(cat "$f")/status")
	rss=$((rss + r))
done
echo "{\"kind\": \"up\", \"hosts\": $N, \"up_ms\": $(((t1 - t0) / 1000000)), \"rss_kib\": $rss, \"avail_drop_kib\": $((a0 - a1))}" >>"$OUT"

for i in $(seq 1 "$N"); do
	# nsenter execs python, so $! is the server itself.
	nsenter --net="/run/netns/$KRFS_NS-h$i" $PY "$here/mesh-reach.py" serve --bind "$KRFS_NET.$i" --port 7300 >/dev/null 2>&1 &
	servers+=($!)
done

# The reference: cold pairs, one at a time, before any mesh traffic.
for k in 1 2 3 4 5; do
	h=$((N - k + 1)) p=$k
	[ "$h" -gt "$p" ] || break
	in_host "$h" $reach alone --mount "$KRFS_DIR/h$h" --peer "$p" >>"$OUT" || echo "mesh.sh: cold pair $h -> $p alone failed" >&2
done

# mesh KIND: every host at once, started together.
mesh() {
	local kind=$1 at=0 pids=() gate=$KRFS_DIR/gate
	# The gate: a FIFO held open here; every host blocks reading it once
	# ready, and closing it releases them all at once.
	rm -f "$gate" "$KRFS_DIR"/ready-*
	mkfifo "$gate"
	exec 3<>"$gate"
	for i in $(seq 1 "$N"); do
		local sync=(--gate "$gate" --ready "$KRFS_DIR/ready-$i")
		[ "$START" = gate ] || sync=(--ready "$KRFS_DIR/ready-$i")
		if [ "$kind" = tcp ]; then
			in_host "$i" $reach tcp --peers "$(ips_of "$i")" --port 7300 "${sync[@]}" >"$KRFS_DIR/mesh-$i.json" 3>&- &
		else
			in_host "$i" $reach files --mount "$KRFS_DIR/h$i" --peers "$(peers_of "$i")" "${sync[@]}" >"$KRFS_DIR/mesh-$i.json" 3>&- &
		fi
		pids+=($!)
	done
	for _ in $(seq 1 6000); do
		[ "$(find "$KRFS_DIR" -maxdepth 1 -name 'ready-*' | wc -l)" -ge "$N" ] && break
		sleep 0.05
	done
	exec 3>&-
	local fail=0
	for p in "${pids[@]}"; do wait "$p" || fail=1; done
	for i in $(seq 1 "$N"); do
		python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); d.update(phase=sys.argv[2], host=int(sys.argv[3]), start_at=int(sys.argv[4])); print(json.dumps(d))' \
			"$KRFS_DIR/mesh-$i.json" "$2" "$i" "$at" >>"$OUT"
	done
	[ $fail = 0 ] || echo "mesh.sh: some pairs failed in the $2 mesh" >&2
}
mesh files files-cold
mesh files files-warm
mesh tcp tcp

# The API: a fresh krfs node per namespace reaching every daemon.
api() {
	local phase=$1 hosts=$2 pids=()
	for i in $hosts; do
		in_host "$i" "$BIN" bench fullmesh --meta "$KRFS_NET.254:4790" --gid 1 --listen "$KRFS_NET.$i:0" \
			-n 3 --json --progress off --timeout 60s >"$KRFS_DIR/api-$i.json" &
		pids+=($!)
	done
	for p in "${pids[@]}"; do wait "$p" || echo "mesh.sh: an api fullmesh failed" >&2; done
	for i in $hosts; do
		python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); r=d["latency"][0]["rows"][0]; print(json.dumps({"kind": "api", "phase": sys.argv[2], "host": int(sys.argv[3]), "peers": int(sys.argv[4]), "typical_us": r["t_typical_us"], "min_us": r["t_min_us"], "iterations": r["iterations"]}))' \
			"$KRFS_DIR/api-$i.json" "$phase" "$i" "$N" >>"$OUT" 2>/dev/null || true # a failed run left no JSON (its error is above)
	done
}
api api-alone 1
api api-mesh "$(seq 1 "$N" | paste -sd' ' -)"

t2=$(date +%s%N)
"$here/cluster.sh" down >/dev/null
t3=$(date +%s%N)
echo "{\"kind\": \"down\", \"down_ms\": $(((t3 - t2) / 1000000))}" >>"$OUT"

python3 - "$OUT" "$N" "$START" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
N = int(sys.argv[2])
med = statistics.median
up = next(r for r in rows if r["kind"] == "up")
down = next(r for r in rows if r["kind"] == "down")
print("full mesh of %d krfs daemons (%d ordered pairs), start: %s" % (N, N * (N - 1), sys.argv[3]))
print("bring-up: %.1f s; daemons' RSS %.0f MiB (%.1f MiB per daemon); machine's available memory -%.0f MiB; teardown %.1f s" % (
    up["up_ms"] / 1e3, up["rss_kib"] / 1024, up["rss_kib"] / 1024 / (N + 1), up["avail_drop_kib"] / 1024, down["down_ms"] / 1e3))
alone = [r for r in rows if r["kind"] == "alone" and "error" not in r]
if len(alone) < len([r for r in rows if r["kind"] == "alone"]):
    print("alone: %d of the reference pairs failed" % sum(1 for r in rows if r["kind"] == "alone" and "error" in r))
if not alone:
    alone = [{"cold_open_read8_us": float("nan"), "warm_read8_us": float("nan")}]
ref = med(r["cold_open_read8_us"] for r in alone)
warm = med(r["warm_read8_us"] for r in alone)
print("alone: cold open + 8 B pread p50 %.0f us over %d pairs (warm pread %.0f us)" % (ref, len(alone), warm))
print()
print("| mesh | pairs | wall ms | per pair, amortized (wall / pairs) us | per pair, seen by a host p50 us | pair latency p50 us | errors |")
print("|---|---:|---:|---:|---:|---:|---:|")
for ph in ["files-cold", "files-warm", "tcp"]:
    rs = [r for r in rows if r.get("phase") == ph]
    if not rs:
        continue
    pairs = sum(r["pairs"] for r in rs)
    wall = (max(r["end_ns"] for r in rs) - min(r["start_ns"] for r in rs)) / 1e3
    host = med(r["total_us"] / max(r["pairs"], 1) for r in rs)
    lat = med(x for r in rs for x in r["pair_us"])
    print("| %s | %d | %.1f | %.1f | %.0f | %.0f | %d |" % (ph, pairs, wall / 1e3, wall / pairs, host, lat, sum(r["errors"] for r in rs)))
for ph in ["api-alone", "api-mesh"]:
    rs = [r for r in rows if r.get("phase") == ph]
    if rs:
        per = med(r["typical_us"] / r["peers"] for r in rs)
        print("| %s (%d process(es), fresh node -> %d daemons) | %d per iteration | — | — | %.0f | — | — |" % (ph, len(rs), N, N * len(rs), per))
print()
cold = [r for r in rows if r.get("phase") == "files-cold"]
if cold:
    pairs = sum(r["pairs"] for r in cold)
    wall = (max(r["end_ns"] for r in cold) - min(r["start_ns"] for r in cold)) / 1e3
    host = med(r["total_us"] / max(r["pairs"], 1) for r in cold)
    print("files-cold per pair vs one cold pair alone: amortized %.2fx, seen by a host %.2fx (target <= 1.5x)" % (wall / pairs / ref, host / ref))
EOF
echo "raw: $OUT"
