#!/usr/bin/env bash
# rtcount.sh: what one RACE bootstrap through the files costs, counted
# (not timed): FUSE requests by opcode (RELEASE, FLUSH and FORGET, which
# come after the value, left out), and the host's daemon's directory
# READs, peer lookups (qpcore Connect misses) and meta client lookups
# (DCCache hits included), per fresh process. Counts do not depend on the
# machine's load, so they compare two builds exactly.
#
#   examples/race/rtcount.sh            4 memory nodes, 1 compute host
#
# Process 1 finds the compute host's daemon cold (it never reached the
# memory nodes); processes 2-4 start 1.5 s after the previous one (the
# mount's 1 s entry and attribute timeouts have expired), process 5 right
# after process 4 (how soon depends on the load). Environment: MEMNODES, KEYS, KRFS_NS, KRFS_NET,
# KRFS_DIR as for scripts/cluster.sh.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
top=$(cd "$here/../.." && pwd)
export KRFS_NS=${KRFS_NS:-krc$$} KRFS_NET=${KRFS_NET:-10.95.0} KRFS_DIR=${KRFS_DIR:-/run/krfs-rc$$} KRFS_MEM=${KRFS_MEM:-4M}
export KRFS_MOUNT_FLAGS="${KRFS_MOUNT_FLAGS:-} --debug-fuse"
MEMNODES=${MEMNODES:-4}
KEYS=${KEYS:-500}
PY=${PYTHON:-$(python3 -c 'import sys; print(sys.executable)')}
race="$PY $here/race.py"
(cd "$top" && go build -o bin/krfs ./cmd/krfs && go build -o bin/raceboot ./examples/race/raceboot)
boot=$top/bin/raceboot
trap '"$top/scripts/cluster.sh" down >/dev/null 2>&1 || true' EXIT
loader=$((MEMNODES + 1))
h=$((MEMNODES + 2))
"$top/scripts/cluster.sh" up "$h" >/dev/null
nodes=$(seq -s, 1 "$MEMNODES")
$race init --mount "$KRFS_DIR/h$loader" --nodes "$nodes" --buckets $((KEYS / MEMNODES / 4 + 64))
$race load --mount "$KRFS_DIR/h$loader" --nodes "$nodes" --keys "$KEYS" >/dev/null
log=$KRFS_DIR/h$h.log
stat() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); n=d["Node"]; print(n["DirReads"], n["ConnectMisses"], d["Meta"]["Lookups"])' "$KRFS_DIR/h$h/stats.json"; }
echo "| process | daemon | FUSE requests | LOOKUP | GETATTR | OPEN | READ | directory READs | qpcore peer lookups | meta client lookups |"
echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"
for i in 1 2 3 4 5; do
	case $i in 1) state=cold ;; 5) state="warm, next" ;; *) state="warm, 1.5 s later"; sleep 1.5 ;; esac
	read -r d0 c0 m0 < <(stat)
	l0=$(wc -l <"$log")
	key=$(printf 'key-%08d' $((i * 37 % KEYS)))
	nsenter --net="/run/netns/$KRFS_NS-h$h" "$boot" -mode files -mount "$KRFS_DIR/h$h" -nodes "$nodes" "$key" >/dev/null
	sleep 0.2 # the last requests of the exiting process reach the log
	l1=$(wc -l <"$log")
	read -r d1 c1 m1 < <(stat)
	# Requests of this process: those logged between l0 and l1 (the
	# stats.json reads of stat() fall outside).
	sed -n "$((l0 + 1)),${l1}p" "$log" | python3 -c '
import re, sys
ops = {}
for line in sys.stdin:
    m = re.search(r"rx \d+: (\w+) (?:n\d+ )?(.*)", line)
    if m is None:
        continue
    ops[m.group(1)] = ops.get(m.group(1), 0) + 1
print(sys.argv[1], sys.argv[2], *[ops.get(k, 0) for k in ["LOOKUP", "GETATTR", "OPEN", "READ"]], sum(v for k, v in ops.items() if k not in ("FORGET", "BATCH_FORGET", "RELEASE", "FLUSH", "INTERRUPT")), sep="\t")
' "$i" "$state" | while IFS=$'\t' read -r n st lk ga op rd tot; do
		echo "| $n | $st | $tot | $lk | $ga | $op | $rd | $((d1 - d0)) | $((c1 - c0)) | $((m1 - m0)) |"
	done
done
