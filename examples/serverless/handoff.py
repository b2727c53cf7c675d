#!/usr/bin/env python3
"""handoff.py: hand an object from one short-lived function to the next
through krfs ports (two-sided messages), or through a TCP socket.

  consumer (function 2, host B)             producer (function 1, host A)
  -----------------------------             -----------------------------
  touch MOUNT_B/ports/P   (bind)            touch MOUNT_A/ports/R   (bind)
                                            for each chunk:
  read(MOUNT_B/ports/P) <- one message <--- write(MOUNT_A/peers/B/ports/P)
  ... until every chunk is in
  write(MOUNT_B/peers/A/ports/R) ---------> read(MOUNT_A/ports/R): ack
  rm ports/P, exit                          rm ports/R, exit

One write() of a port file is one message and one read() returns one
(fs.MaxMessage = 1 MiB - 4 KiB at most), so an object is cut into chunks.
Every message starts with a 40-byte header (little endian):

  0  magic "KRSV"   4  version u8 (1)   5  kind u8 (1 chunk, 2 ack)
  6  reserved u16   8  object id u64   16  object size u64
  24 chunk index u32   28 chunk count u32
  32 sender gid u32    36 reply port u32 (where the ack goes)

A chunk's payload follows its header; chunks are of equal size (the last
may be shorter), at most 1 MiB - 8 KiB, so that a chunk of an object of
64 KiB or more is itself at least 64 KiB and krfs moves it by zero-copy
rendezvous (the receiver's NIC READs it straight from the sender's
buffer); smaller objects go as one eager message. The receiver places
each chunk at index * chunk size, so the order of arrival does not
matter, and counts chunks. The ack carries the SHA-256 of what the
consumer received; the producer exits successfully only if it matches
its own. The TCP variant sends the same header once, then the object as
a stream, and gets the same ack back.

Subcommands:
  recv  --mount M --port P [--out FILE]              krfs consumer
  send  --mount M --to GID --port P --reply R (--in FILE | --size N)
  tcprecv --bind IP --port P [--out FILE]            TCP consumer
  tcpsend --to IP --port P (--in FILE | --size N)    TCP producer
Each prints one JSON line with wall-clock timestamps (time.time_ns, the
same clock on every namespace of one machine). bench.sh runs both
variants for a list of sizes and prints the latency table.
"""

import argparse
import hashlib
import json
import os
import signal
import socket
import struct
import sys
import time

HDR = struct.Struct("<4sBBHQQIIII")  # 40 bytes
MAGIC = b"KRSV"
KIND_CHUNK, KIND_ACK = 1, 2
MAX_MESSAGE = (1 << 20) - 4096  # fs.MaxMessage
MAX_CHUNK = (1 << 20) - 8192    # payload per message, header included stays below MAX_MESSAGE
RECV_BUF = 2 << 20


class HandoffError(Exception):
    pass


def chunking(size):
    """(chunk size, chunk count) for an object of size bytes."""
    if size == 0:
        return 0, 1
    n = -(-size // MAX_CHUNK)
    c = -(-size // n)
    c = -(-c // 4096) * 4096 if n > 1 else c
    return c, -(-size // c)


def self_gid(mount):
    """This node's gid: the one peers/<gid>/info of ours says is us."""
    with open(os.path.join(mount, "stats")) as f:
        for line in f:
            parts = line.split()
            if len(parts) == 2 and parts[0] == "gid":
                return int(parts[1])
    raise HandoffError("cannot find this node's gid in %s/stats (pass --gid)" % mount)


def bind(mount, port):
    path = os.path.join(mount, "ports", str(port))
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o600)
    except FileExistsError:
        raise HandoffError("port %d is already bound on this host" % port)
    return path, fd


def obj_of(a):
    if a.input:
        with open(a.input, "rb") as f:
            return f.read()
    return os.urandom(a.size)


def with_timeout(seconds):
    def on_alarm(sig, frm):
        raise HandoffError("timed out after %d s" % seconds)
    signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(seconds)


# ---- krfs -----------------------------------------------------------------

def cmd_recv(a):
    path, fd = bind(a.mount, a.port)
    try:
        print(json.dumps({"ready": True}), flush=True)
        with_timeout(a.timeout)
        buf = bytearray(RECV_BUF)
        mv = memoryview(buf)
        obj = None
        got = set()
        t_first = None
        while True:
            n = os.readv(fd, [buf])
            if t_first is None:
                t_first = time.time_ns()
            if n < HDR.size:
                raise HandoffError("short message (%d bytes)" % n)
            magic, ver, kind, _, oid, size, idx, count, src, reply = HDR.unpack_from(buf)
            if magic != MAGIC or ver != 1 or kind != KIND_CHUNK:
                raise HandoffError("not a hand-off chunk")
            csize, ccount = chunking(size)
            if count != ccount or idx >= count:
                raise HandoffError("chunk %d of %d does not fit an object of %d bytes" % (idx, count, size))
            if obj is None:
                obj, first = bytearray(size), (oid, size, src, reply)
            elif (oid, size, src, reply) != first:
                raise HandoffError("a chunk of another object arrived")
            want = min(csize, size - idx * csize)
            if n - HDR.size != want:
                raise HandoffError("chunk %d has %d bytes, want %d" % (idx, n - HDR.size, want))
            obj[idx * csize:idx * csize + want] = mv[HDR.size:n]
            got.add(idx)
            if len(got) == count:
                break
        t_done = time.time_ns()
        digest = hashlib.sha256(obj).digest()
        ack = HDR.pack(MAGIC, 1, KIND_ACK, 0, oid, size, 0, 0, 0, 0) + digest
        afd = os.open(os.path.join(a.mount, "peers", str(src), "ports", str(reply)), os.O_WRONLY)
        os.write(afd, ack)
        os.close(afd)
        signal.alarm(0)
        if a.out:
            with open(a.out, "wb") as f:
                f.write(obj)
        print(json.dumps({"side": "recv", "mode": "krfs", "bytes": size, "chunks": count,
                          "t_first": t_first, "t_done": t_done, "sha256": digest.hex()}))
    finally:
        os.close(fd)
        os.unlink(path)


def cmd_send(a):
    obj = obj_of(a)
    size = len(obj)
    gid = a.gid or self_gid(a.mount)
    rpath, rfd = bind(a.mount, a.reply)
    try:
        with_timeout(a.timeout)
        oid = int.from_bytes(os.urandom(8), "little")
        csize, count = chunking(size)
        mv = memoryview(obj)
        t0 = time.time_ns()
        fd = os.open(os.path.join(a.mount, "peers", str(a.to), "ports", str(a.port)), os.O_WRONLY)
        for i in range(count):
            part = mv[i * csize:min(size, (i + 1) * csize)]
            # One message per write(); the header is prepended in user
            # space (one copy of the chunk in this process).
            os.write(fd, HDR.pack(MAGIC, 1, KIND_CHUNK, 0, oid, size, i, count, gid, a.reply) + part)
        t_sent = time.time_ns()
        os.close(fd)
        ack = os.read(rfd, RECV_BUF)
        t_acked = time.time_ns()
        signal.alarm(0)
        digest = hashlib.sha256(obj).digest()
        ok = (len(ack) == HDR.size + 32 and ack[:4] == MAGIC and HDR.unpack_from(ack)[2] == KIND_ACK
              and HDR.unpack_from(ack)[4] == oid and ack[HDR.size:] == digest)
        print(json.dumps({"side": "send", "mode": "krfs", "bytes": size, "chunks": count, "t_start": t0,
                          "t_sent": t_sent, "t_acked": t_acked, "sha256": digest.hex(), "identical": ok}))
        if not ok:
            raise HandoffError("the consumer's digest differs: the object was not handed off intact")
    finally:
        os.close(rfd)
        os.unlink(rpath)


# ---- TCP ------------------------------------------------------------------

def recv_into(s, mv):
    while len(mv):
        n = s.recv_into(mv)
        if n == 0:
            raise HandoffError("connection closed")
        mv = mv[n:]


def cmd_tcprecv(a):
    ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind((a.bind, a.port))
    ls.listen(1)
    print(json.dumps({"ready": True}), flush=True)
    with_timeout(a.timeout)
    s, _ = ls.accept()
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    hdr = bytearray(HDR.size)
    recv_into(s, memoryview(hdr))
    t_first = time.time_ns()
    magic, ver, kind, _, oid, size, _, _, _, _ = HDR.unpack(hdr)
    if magic != MAGIC or kind != KIND_CHUNK:
        raise HandoffError("not a hand-off")
    obj = bytearray(size)
    recv_into(s, memoryview(obj))
    t_done = time.time_ns()
    digest = hashlib.sha256(obj).digest()
    s.sendall(HDR.pack(MAGIC, 1, KIND_ACK, 0, oid, size, 0, 0, 0, 0) + digest)
    s.close()
    ls.close()
    signal.alarm(0)
    if a.out:
        with open(a.out, "wb") as f:
            f.write(obj)
    print(json.dumps({"side": "recv", "mode": "tcp", "bytes": size, "chunks": 1,
                      "t_first": t_first, "t_done": t_done, "sha256": digest.hex()}))


def cmd_tcpsend(a):
    obj = obj_of(a)
    size = len(obj)
    with_timeout(a.timeout)
    oid = int.from_bytes(os.urandom(8), "little")
    t0 = time.time_ns()
    s = socket.create_connection((a.to, a.port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.sendall(HDR.pack(MAGIC, 1, KIND_CHUNK, 0, oid, size, 0, 1, 0, 0))
    s.sendall(obj)
    t_sent = time.time_ns()
    ack = bytearray(HDR.size + 32)
    recv_into(s, memoryview(ack))
    t_acked = time.time_ns()
    s.close()
    signal.alarm(0)
    digest = hashlib.sha256(obj).digest()
    ok = HDR.unpack_from(ack)[4] == oid and bytes(ack[HDR.size:]) == digest
    print(json.dumps({"side": "send", "mode": "tcp", "bytes": size, "chunks": 1, "t_start": t0,
                      "t_sent": t_sent, "t_acked": t_acked, "sha256": digest.hex(), "identical": ok}))
    if not ok:
        raise HandoffError("the consumer's digest differs: the object was not handed off intact")


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)

    def src(q):
        g = q.add_mutually_exclusive_group(required=True)
        g.add_argument("--in", dest="input", help="file holding the object")
        g.add_argument("--size", type=int, help="a random object of this many bytes")

    q = sub.add_parser("recv", help="krfs consumer")
    q.add_argument("--mount", required=True)
    q.add_argument("--port", type=int, required=True)
    q.add_argument("--out", help="write the object here")
    q = sub.add_parser("send", help="krfs producer")
    q.add_argument("--mount", required=True)
    q.add_argument("--to", type=int, required=True, help="the consumer's gid")
    q.add_argument("--port", type=int, required=True, help="the consumer's port")
    q.add_argument("--reply", type=int, required=True, help="this producer's port for the ack")
    q.add_argument("--gid", type=int, default=0, help="this host's gid (default: read from MOUNT/stats)")
    src(q)
    q = sub.add_parser("tcprecv", help="TCP consumer")
    q.add_argument("--bind", default="0.0.0.0")
    q.add_argument("--port", type=int, required=True)
    q.add_argument("--out")
    q = sub.add_parser("tcpsend", help="TCP producer")
    q.add_argument("--to", required=True, help="the consumer's IP address")
    q.add_argument("--port", type=int, required=True)
    src(q)
    for q in sub.choices.values():
        q.add_argument("--timeout", type=int, default=60, help="give up after this many seconds")
    a = p.parse_args(argv)
    if getattr(a, "size", None) is not None and not 0 <= a.size <= 1 << 30:
        p.error("--size: 0 to 1 GiB")
    try:
        {"recv": cmd_recv, "send": cmd_send, "tcprecv": cmd_tcprecv, "tcpsend": cmd_tcpsend}[a.cmd](a)
    except (HandoffError, OSError) as e:
        print("handoff.py %s: %s" % (a.cmd, e), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
