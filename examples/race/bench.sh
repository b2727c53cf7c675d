#!/usr/bin/env bash
# bench.sh: the RACE bootstrap benchmark, every variant in one run on a
# namespace cluster of its own.
#
#   examples/race/bench.sh                 4 memory nodes, 5 fresh compute hosts
#   MEMNODES=8 FRESH=3 examples/race/bench.sh
#
# Hosts 1..MEMNODES are memory nodes (their default region holds the
# table, and each also runs `race.py serve`, the TCP baseline); host
# MEMNODES+1 loads KEYS keys; every later host is a fresh compute host.
# On each fresh host, one after another (the first once, the others REPS
# times), a new process connects to every
# memory node and serves one lookup of a random loaded key:
#
#   krfs-files, cold   race.py lookup: the host's daemon has never reached
#                      the memory nodes (meta lookup + VQP + directory READ)
#   krfs-files, warm   the same again: a new process, the daemon knows them
#   tcp                race.py tcplookup: TCP connect to every node's server
#   go-files           raceboot -mode files: the same lookup from Go, on the
#                      host's krfs files (warm daemon; no NIC of its own)
#   go-vqp             raceboot -mode vqp: a fresh in-process krfs node (NIC,
#                      meta client, VQPs over DCT)
#   go-rc              raceboot -mode rc: a fresh NIC and RC QPs created from
#                      scratch (CM handshake with each memory node's daemon)
#   go-files-par, go-rc-par   the same two with -parallel: every memory
#                      node connected at once (a goroutine each)
#   go-files-par-cold  on odd fresh hosts, instead of krfs-files-cold, the
#                      first process is go-files-par (the daemon cold)
#   floor, floor-cold  raceboot -mode floor: the bootstrap's round trips in
#                      raw UDP to echo servers (krfs-baseline serve) on the
#                      memory nodes' hosts (a header READ per node, then the
#                      lookup's 3 READs), with -cold one to the meta service's
#                      host before each node's: the floor of a warm and of a
#                      cold daemon's bootstrap
#
# and, once, raceboot -mode coldpeer: cold connect + first 8-byte READ
# against one warm READ, interleaved with the same pattern of round trips
# in raw UDP to echo servers (krfs-baseline serve) on the meta service's
# host and the memory nodes' hosts: this run's floor. "bootstrap" is measured inside the process (from
# its first line to the looked-up value); "process" from just before the
# process is started to the value (interpreter or Go runtime start
# included). Environment: MEMNODES, FRESH, REPS, KEYS, OUT (raw JSON lines),
# KRFS_NS, KRFS_NET, KRFS_DIR as for scripts/cluster.sh.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
top=$(cd "$here/../.." && pwd)
export KRFS_NS=${KRFS_NS:-krb$$} KRFS_NET=${KRFS_NET:-10.94.0} KRFS_DIR=${KRFS_DIR:-/run/krfs-rb$$} KRFS_MEM=${KRFS_MEM:-8M}
MEMNODES=${MEMNODES:-4}
FRESH=${FRESH:-6}
REPS=${REPS:-3}
KEYS=${KEYS:-5000}
OUT=${OUT:-$(mktemp /tmp/raceboot.XXXXXX.jsonl)}
# The interpreter itself, not a wrapper (a pyenv shim adds ~0.3 s per start).
PY=${PYTHON:-$(python3 -c 'import sys; print(sys.executable)')}
race="$PY $here/race.py"
(cd "$top" && go build -o bin/krfs ./cmd/krfs && go build -o bin/raceboot ./examples/race/raceboot)
boot=$top/bin/raceboot

pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	"$top/scripts/cluster.sh" down >/dev/null 2>&1 || true
}
trap cleanup EXIT
in_host() { local h=$1; shift; nsenter --net="/run/netns/$KRFS_NS-h$h" "$@"; }

loader=$((MEMNODES + 1))
hosts=$((MEMNODES + 1 + FRESH))
"$top/scripts/cluster.sh" up "$hosts" >/dev/null
nodes=$(seq -s, 1 "$MEMNODES")
servers=$(for i in $(seq 1 "$MEMNODES"); do printf '%s:7000,' "$KRFS_NET.$i"; done)
servers=${servers%,}
buckets=$((KEYS / MEMNODES / 4 + 64))
$race init --mount "$KRFS_DIR/h$loader" --nodes "$nodes" --buckets "$buckets"
$race load --mount "$KRFS_DIR/h$loader" --nodes "$nodes" --keys "$KEYS" >&2
for i in $(seq 1 "$MEMNODES"); do
	# nsenter execs python, so $! is the server itself.
	nsenter --net="/run/netns/$KRFS_NS-h$i" $PY "$here/race.py" serve --local "$KRFS_DIR/h$i/regions/mem" --bind "$KRFS_NET.$i" --port 7000 >/dev/null &
	pids+=($!)
done
sleep 1 # the servers bind

# measure NAME HOST CMD...: one fresh process; its JSON plus the process
# time. A process that fails (on a loaded machine an RC QP of the baseline
# can exhaust its retries) is recorded as failed and counted in the
# summary; the run goes on.
measure() {
	local name=$1 h=$2; shift 2
	local t0 t1 out
	t0=$(date +%s%N)
	if ! out=$(in_host "$h" "$@"); then
		echo "bench.sh: $name on host $h failed" >&2
		printf '{"variant": "%s", "host": %d, "failed": true}\n' "$name" "$h" >>"$OUT"
		return 0
	fi
	t1=$(date +%s%N)
	# The process time ends at the value (the wall_ns it reports), not at
	# its exit: tearing its NIC and QPs down is not part of the start.
	python3 -c 'import json,sys; d=json.loads(sys.argv[1]); d.update(variant=sys.argv[2], host=int(sys.argv[3]), process_us=(d.get("wall_ns", int(sys.argv[5]))-int(sys.argv[4]))/1e3); print(json.dumps(d))' \
		"$out" "$name" "$h" "$t0" "$t1" >>"$OUT"
}

# The UDP echo servers of the floors (the bootstrap's round trips and
# the cold peer's in raw UDP): on the meta service's host, then on every
# memory node's; each runs until its stdin closes.
(cd "$top" && go build -o bin/krfs-baseline ./cmd/krfs-baseline)
echoes=
for ns in meta $(seq 1 "$MEMNODES"); do
	if [ "$ns" = meta ]; then ip=$KRFS_NET.254; else ip=$KRFS_NET.$ns; ns=h$ns; fi
	fifo=$(mktemp -u /tmp/krfs-echo.XXXXXX)
	mkfifo "$fifo"
	nsenter --net="/run/netns/$KRFS_NS-$ns" "$top/bin/krfs-baseline" serve -addr "$ip" <"$fifo" >"$fifo.out" &
	pids+=($!)
	exec {fd}>"$fifo" # held open until this script exits
	rm -f "$fifo"
	for _ in $(seq 50); do [ -s "$fifo.out" ] && break; sleep 0.1; done
	echoes+=$(sed -n 's/^udp=\([^ ]*\).*/\1/p' "$fifo.out"),
	rm -f "$fifo.out"
done
: >"$OUT"
for h in $(seq $((loader + 1)) "$hosts"); do
	key=$(printf 'key-%08d' $((RANDOM * 7 % KEYS)))
	m=$KRFS_DIR/h$h
	# The first process on a fresh host finds its daemon cold: Python on
	# even hosts, Go (memory nodes in parallel) on odd ones.
	if [ $((h % 2)) = 0 ]; then
		measure krfs-files-cold "$h" $race lookup --mount "$m" --nodes "$nodes" "$key"
	else
		measure go-files-par-cold "$h" "$boot" -mode files -parallel -mount "$m" -nodes "$nodes" "$key"
	fi
	for _ in $(seq 1 "$REPS"); do
		measure krfs-files-warm "$h" $race lookup --mount "$m" --nodes "$nodes" "$key"
		measure tcp "$h" $race tcplookup --servers "$servers" "$key"
		measure go-files "$h" "$boot" -mode files -mount "$m" -nodes "$nodes" "$key"
		measure go-vqp "$h" "$boot" -mode vqp -meta "$KRFS_NET.254:4790" -listen "$KRFS_NET.$h:0" -nodes "$nodes" "$key"
		measure go-rc "$h" "$boot" -mode rc -meta "$KRFS_NET.254:4790" -listen "$KRFS_NET.$h:0" -nodes "$nodes" "$key"
		measure go-files-par "$h" "$boot" -mode files -parallel -mount "$m" -nodes "$nodes" "$key"
		measure go-rc-par "$h" "$boot" -mode rc -parallel -meta "$KRFS_NET.254:4790" -listen "$KRFS_NET.$h:0" -nodes "$nodes" "$key"
		measure floor "$h" "$boot" -mode floor -listen "$KRFS_NET.$h:0" -nodes "$nodes" -echo "${echoes%,}" "$key"
		measure floor-cold "$h" "$boot" -mode floor-cold -listen "$KRFS_NET.$h:0" -nodes "$nodes" -echo "${echoes%,}" "$key"
	done
done
in_host "$hosts" "$boot" -mode coldpeer -meta "$KRFS_NET.254:4790" -listen "$KRFS_NET.$hosts:0" -nodes "$nodes" -n 300 -echo "${echoes%,}" >>"$OUT" ||
	echo "bench.sh: raceboot -mode coldpeer failed" >&2

python3 - "$OUT" "$MEMNODES" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
med = statistics.median
by = {}
failed = {}
for r in rows:
    if r.get("failed"):
        failed[r["variant"]] = failed.get(r["variant"], 0) + 1
    elif "variant" in r:
        by.setdefault(r["variant"], []).append(r)
print("RACE bootstrap, %s memory nodes: a fresh process connects to every memory node and serves one lookup" % sys.argv[2])
print()
print("| variant | runs | failed | bootstrap p50 us (in process) | of which connect | first lookup | process p50 us (start to value) |")
print("|---|---:|---:|---:|---:|---:|---:|")
for v in ["krfs-files-cold", "krfs-files-warm", "tcp", "go-files", "go-vqp", "go-rc", "go-files-par-cold", "go-files-par", "go-rc-par", "floor", "floor-cold"]:
    rs = by.get(v, [])
    if not rs:
        continue
    conn = [r["bootstrap_us"] - r["lookup_us"] for r in rs]
    print("| %s | %d | %d | %.0f | %.0f | %.0f | %.0f |" % (v, len(rs), failed.get(v, 0), med(r["bootstrap_us"] for r in rs), med(conn),
          med(r["lookup_us"] for r in rs), med(r["process_us"] for r in rs)))
def m(v, k="bootstrap_us"):
    return med(r[k] for r in by[v]) if v in by else float("nan")
print()
print("go-rc / go-files bootstrap: %.2fx (target >= 5x); go-rc / go-vqp: %.2fx" % (m("go-rc") / m("go-files"), m("go-rc") / m("go-vqp")))
if "go-rc-par" in by and "go-files-par" in by:
    print("memory nodes in parallel: go-rc-par / go-files-par bootstrap: %.2fx (target >= 5x)" % (m("go-rc-par") / m("go-files-par")))
    if "go-files-par-cold" in by:
        print("memory nodes in parallel, host's daemon cold: go-rc-par / go-files-par-cold: %.2fx" % (m("go-rc-par") / m("go-files-par-cold")))
def connect_part(v):
    return med(r["bootstrap_us"] - r["lookup_us"] for r in by[v]) if v in by else float("nan")
print("go-rc connect part / go-files connect part: %.2fx" % (connect_part("go-rc") / connect_part("go-files")))
print("tcp / krfs-files-cold bootstrap: %.2fx; tcp / krfs-files-warm: %.2fx" % (m("tcp") / m("krfs-files-cold"), m("tcp") / m("krfs-files-warm")))
print("against TCP (krfs / tcp bootstrap, lower is better): Python warm %.2fx (target <= 0.8x), Python cold %.2fx, Go warm %.2fx, Go -par cold %.2fx" % (
    m("krfs-files-warm") / m("tcp"), m("krfs-files-cold") / m("tcp"), m("go-files") / m("tcp"), m("go-files-par-cold") / m("tcp")))
print("against the floor (its round trips in raw UDP, same hosts): Python warm %.2fx, Go warm %.2fx of floor; Python cold %.2fx, Go -par cold %.2fx of floor-cold" % (
    m("krfs-files-warm") / m("floor"), m("go-files") / m("floor"), m("krfs-files-cold") / m("floor-cold"), m("go-files-par-cold") / m("floor-cold")))
for r in rows:
    if r.get("mode") == "coldpeer":
        print("cold connect + first 8 B READ p50 %.1f us vs warm 8 B READ p50 %.1f us: %.2fx (target <= 2.3x), %d iterations" % (
            r["cold_connect_read8_p50_us"], r["warm_read8_p50_us"], r["ratio"], r["iterations"]))
        if "udp_ratio" in r:
            print("the same pattern in raw UDP (floor, interleaved): meta host + peer round trips p50 %.1f us vs one more to the peer p50 %.1f us: %.2fx" % (
                r["udp_cold_pair_p50_us"], r["udp_warm_p50_us"], r["udp_ratio"]))
EOF
echo "raw: $OUT"
