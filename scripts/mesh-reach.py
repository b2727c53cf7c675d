#!/usr/bin/env python3
"""mesh-reach.py: one host's part of a full-mesh measurement (scripts/mesh.sh).

  files --mount M --peers G,G,.. [--start-at NS]
        for each peer in turn: open M/peers/G/mem (a VQP; cold if this
        host's daemon never reached G), pread 8 bytes at 0, close
  tcp   --peers IP,IP,.. --port P [--start-at NS]
        for each peer in turn: TCP connect, send 8 bytes, receive 8, close
  serve --bind IP --port P
        the TCP side: answer every 8-byte request with 8 bytes
  alone --mount M --peer G
        one cold open + 8-byte pread + close of one peer (the reference a
        mesh's per-pair cost is judged by), then one warm pread

files and tcp start together: each creates its --ready file and blocks
reading the FIFO --gate until the orchestrator closes it (or waits until
the wall-clock time --start-at, ns since the epoch). They print one JSON line: per-pair times, the host's total,
start and end. Python 3 standard library only.
"""

import argparse
import json
import os
import socket
import statistics
import sys
import threading
import time


def wait_gate(a):
    """Start together: the orchestrator holds the FIFO --gate open for
    writing; signal readiness with --ready, block in read() until it closes
    the FIFO, which releases every host at once."""
    if a.gate:
        fd = os.open(a.gate, os.O_RDONLY)
        open(a.ready, "w").close()
        os.read(fd, 1)
        os.close(fd)
    elif a.ready:
        open(a.ready, "w").close()
    wait_until(a.start_at)


def wait_until(ns):
    if ns:
        d = (ns - time.time_ns()) / 1e9
        if d > 0:
            time.sleep(d)


def report(kind, pairs, t_start, t_end, extra=None):
    d = {"kind": kind, "pairs": len(pairs), "start_ns": t_start, "end_ns": t_end,
         "total_us": (t_end - t_start) / 1e3,
         "p50_us": statistics.median(pairs) if pairs else 0, "max_us": max(pairs) if pairs else 0,
         "pair_us": pairs}
    if extra:
        d.update(extra)
    print(json.dumps(d))


def cmd_files(a):
    peers = [p for p in a.peers.split(",") if p]
    buf = bytearray(8)
    paths = [os.path.join(a.mount, "peers", p, "mem") for p in peers]
    wait_gate(a)
    pairs = []
    errors = 0
    t_start = time.time_ns()
    for path in paths:
        t0 = time.perf_counter_ns()
        try:
            fd = os.open(path, os.O_RDONLY)
            try:
                if os.preadv(fd, [buf], 0) != 8:
                    errors += 1
            finally:
                os.close(fd)
        except OSError as e:
            errors += 1
            print("mesh-reach: %s: %s" % (path, e), file=sys.stderr)
        pairs.append((time.perf_counter_ns() - t0) / 1e3)
    report("files", pairs, t_start, time.time_ns(), {"errors": errors})
    return 1 if errors else 0


def cmd_tcp(a):
    peers = [p for p in a.peers.split(",") if p]
    wait_gate(a)
    pairs = []
    errors = 0
    t_start = time.time_ns()
    for ip in peers:
        t0 = time.perf_counter_ns()
        try:
            s = socket.create_connection((ip, a.port), timeout=30)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.sendall(b"8 bytes!")
            got = b""
            while len(got) < 8:
                c = s.recv(8 - len(got))
                if not c:
                    break
                got += c
            s.close()
            if len(got) != 8:
                errors += 1
        except OSError as e:
            errors += 1
            print("mesh-reach: %s: %s" % (ip, e), file=sys.stderr)
        pairs.append((time.perf_counter_ns() - t0) / 1e3)
    report("tcp", pairs, t_start, time.time_ns(), {"errors": errors})
    return 1 if errors else 0


def cmd_serve(a):
    ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind((a.bind, a.port))
    ls.listen(512)

    def conn(s):
        try:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            got = b""
            while len(got) < 8:
                c = s.recv(8 - len(got))
                if not c:
                    return
                got += c
            s.sendall(got)
        finally:
            s.close()

    while True:
        s, _ = ls.accept()
        threading.Thread(target=conn, args=(s,), daemon=True).start()


def cmd_alone(a):
    path = os.path.join(a.mount, "peers", str(a.peer), "mem")
    buf = bytearray(8)
    t0 = time.perf_counter_ns()
    try:
        fd = os.open(path, os.O_RDONLY)
        os.preadv(fd, [buf], 0)
        os.close(fd)
        t1 = time.perf_counter_ns()
        fd = os.open(path, os.O_RDONLY)
        t2 = time.perf_counter_ns()
        os.preadv(fd, [buf], 0)
        t3 = time.perf_counter_ns()
        os.close(fd)
    except OSError as e:
        print(json.dumps({"kind": "alone", "peer": a.peer, "error": str(e),
                          "after_us": (time.perf_counter_ns() - t0) / 1e3}))
        return 1
    print(json.dumps({"kind": "alone", "peer": a.peer, "cold_open_read8_us": (t1 - t0) / 1e3,
                      "warm_read8_us": (t3 - t2) / 1e3}))
    return 0


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    q = sub.add_parser("files")
    q.add_argument("--mount", required=True)
    q.add_argument("--peers", required=True)
    q.add_argument("--start-at", type=int, default=0)
    q.add_argument("--gate", help="a FIFO to wait on (see wait_gate)")
    q.add_argument("--ready", help="file to create when ready to start")
    q = sub.add_parser("tcp")
    q.add_argument("--peers", required=True)
    q.add_argument("--port", type=int, default=7300)
    q.add_argument("--start-at", type=int, default=0)
    q.add_argument("--gate", help="a FIFO to wait on (see wait_gate)")
    q.add_argument("--ready", help="file to create when ready to start")
    q = sub.add_parser("serve")
    q.add_argument("--bind", required=True)
    q.add_argument("--port", type=int, default=7300)
    q = sub.add_parser("alone")
    q.add_argument("--mount", required=True)
    q.add_argument("--peer", type=int, required=True)
    a = p.parse_args(argv)
    return {"files": cmd_files, "tcp": cmd_tcp, "serve": cmd_serve, "alone": cmd_alone}[a.cmd](a) or 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
