#!/usr/bin/env python3
"""handoff.py: hand an object from one short-lived function to the next
through krfs ports (two-sided messages), or through a TCP socket.

  consumer (function 2, host B)             producer (function 1, host A)
  -----------------------------             -----------------------------
  touch MOUNT_B/ports/P .. P+S-1  (bind)    touch MOUNT_A/ports/R   (bind)
                                            S writers, chunk i on stream i % S:
  S readers: read(MOUNT_B/ports/P+s) <----- write(MOUNT_A/peers/B/ports/P+s)
  ... until every chunk is in
  write(MOUNT_B/peers/A/ports/R) ---------> read(MOUNT_A/ports/R): ack
  rm ports/P .. P+S-1, exit                 rm ports/R, exit

One write() of a port file is one message and one read() returns one
(fs.MaxMessage = 1 MiB - 4 KiB at most), so an object is cut into chunks.
A write returns once its message is pulled, so one writer has one chunk
in flight; the producer runs S writers (--streams, 4 by default), each on
a port of its own (writes to one port file are serialised by the kernel),
so that S chunks are on the wire at once, and the consumer reads each
port from a thread of its own. Every message starts with a 40-byte
header (little endian):

  0  magic "KRSV"   4  version u8 (1)   5  kind u8 (1 chunk, 2 ack)
  6  streams u16 (S)   8  object id u64   16  object size u64
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

From 64 KiB the producer may instead put the object in a region of its
host and send only a descriptor (kind 3, the region's name after the
header); the consumer preads peers/<producer>/mr/<name> (--via region: a
new region per hand-off; --via pool: a reused slot of the host's pool,
claimed with a flock of its file in the daemon's store and zeroed after
the ack; auto: the pool when the store is reachable; see README.md).

Subcommands:
  recv  --mount M --port P [--streams S] [--out FILE]     krfs consumer
  send  --mount M --to GID --port P --reply R [--streams S] (--in FILE | --size N)
  tcprecv --bind IP --port P [--out FILE]            TCP consumer
  tcpsend --to IP --port P (--in FILE | --size N)    TCP producer
Each prints one JSON line with wall-clock timestamps (time.time_ns, the
same clock on every namespace of one machine). bench.sh runs both
variants for a list of sizes and prints the latency table.
"""

import argparse
import fcntl
import hashlib
import json
import mmap
import os
import signal
import socket
import struct
import sys
import threading
import time

HDR = struct.Struct("<4sBBHQQIIII")  # 40 bytes
MAGIC = b"KRSV"
KIND_CHUNK, KIND_ACK, KIND_REGION = 1, 2, 3
MAX_MESSAGE = (1 << 20) - 4096  # fs.MaxMessage
MAX_CHUNK = (1 << 20) - 8192    # payload per message, header included stays below MAX_MESSAGE
RECV_BUF = 2 << 20
ACK_BUF = 4096                  # an ack is 72 bytes: a small buffer has few pages to fault in
STREAMS = 4                     # ports per hand-off: chunks in flight at once
REGION_MIN = 64 << 10           # --via auto: objects from this size go through a region
PIECE = 1 << 20                 # a region read: one FUSE request (fs.MaxIO)
POOL_SLOTS = 8                  # pool regions per size class: hand-offs in flight at once per host


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


def recv(fd, buf):
    """Read one message from a port into buf: a 0 means that the messages
    queued were read (an end of file for tools such as cat and tail), and
    the next read waits for a message."""
    while True:
        n = os.readv(fd, [buf])
        if n:
            return n


def with_timeout(seconds):
    def on_alarm(sig, frm):
        raise HandoffError("timed out after %d s" % seconds)
    signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(seconds)


# ---- krfs -----------------------------------------------------------------

def pull_region(mount, src, name, size, k, piece, steps):
    """READ an object of size bytes from region name of peer src, with k
    preads in flight (pieces of PIECE bytes, each one FUSE request and one
    READ), straight into page-aligned memory of this process."""
    if not name.startswith("ho-") or len(name) > 32:
        raise HandoffError("bad region name in a descriptor: %r" % name)
    path = os.path.join(mount, "peers", str(src), "mr", name)
    # The consumer's daemon may hold a copy of the producer's region
    # directory from just before the region was made (it looks again at
    # most every 100 ms): retry a missing name for a second.
    end = time.monotonic() + 1
    while True:
        try:
            fd = os.open(path, os.O_RDONLY)
            break
        except FileNotFoundError:
            if time.monotonic() > end:
                raise
            time.sleep(0.01)
    steps["t_open"] = time.time_ns()
    try:
        if os.fstat(fd).st_size < size:
            raise HandoffError("region %s holds %d bytes, the descriptor says %d"
                               % (name, os.fstat(fd).st_size, size))
        obj = mmap.mmap(-1, max(size, 1))
        mv = memoryview(obj)
        pieces = iter(range(0, size, piece))
        lock = threading.Lock()
        errs = []

        def puller():
            try:
                while True:
                    with lock:
                        off = next(pieces, None)
                    if off is None:
                        return
                    end = min(size, off + piece)
                    while off < end:
                        n = os.preadv(fd, [mv[off:end]], off)
                        if n <= 0:
                            raise HandoffError("region %s ended at %d of %d bytes" % (name, off, size))
                        off += n
            except BaseException as e:  # noqa: B902 - handed to the caller
                errs.append(e)

        threads = [threading.Thread(target=puller) for _ in range(min(k, -(-size // piece)) - 1)]
        for th in threads:
            th.start()
        puller()
        for th in threads:
            th.join()
        if errs:
            raise errs[0]
        return mv[:size]
    finally:
        os.close(fd)


def pool_class(size):
    """The size of the pool regions an object of size bytes goes through:
    a power of two, at least REGION_MIN."""
    c = REGION_MIN
    while c < size:
        c <<= 1
    return c


class PoolSlot:
    """A claimed region of this host's hand-off pool: regions/ho-pool-<class>-<i>,
    made once (by the first producer that needs it) and then reused by every
    producer on the host, so that a hand-off creates, sizes and removes no
    region and the consumer's daemon already knows its name and key. A slot
    is claimed with an exclusive flock of its file in the daemon's store and
    held until the consumer's ack; the bytes handed over are zeroed before it
    is released, so that no object outlives its hand-off in the pool."""

    def __init__(self, name, fd, size):
        self.name, self.fd, self.size = name, fd, size

    def release(self, used):
        try:
            zero = bytes(min(used, PIECE))
            off = 0
            while off < used:
                off += os.pwrite(self.fd, zero[:min(len(zero), used - off)], off)
        finally:
            os.close(self.fd)  # drops the flock


def claim_pool(a, store, size):
    """Claims a free pool slot of size's class, making the region if no
    producer made it yet; None when every slot is taken."""
    cls = pool_class(size)
    for i in range(POOL_SLOTS):
        name = "ho-pool-%x-%d" % (cls, i)
        spath = os.path.join(store, name)
        try:
            sfd = os.open(spath, os.O_RDWR)
        except FileNotFoundError:
            rpath = os.path.join(a.mount, "regions", name)
            try:
                fd = os.open(rpath, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                continue  # another producer is making it
            try:
                os.ftruncate(fd, cls)
            except OSError:
                os.unlink(rpath)  # no slot of the wrong size left behind
                raise
            finally:
                os.close(fd)
            sfd = os.open(spath, os.O_RDWR)
        try:
            fcntl.flock(sfd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(sfd)
            continue
        if os.fstat(sfd).st_size < size:
            os.close(sfd)  # made by a producer that has not sized it yet
            continue
        return PoolSlot(name, sfd, cls)
    return None


def send_descriptor(a, oid, size, gid, name):
    pfd = os.open(os.path.join(a.mount, "peers", str(a.to), "ports", str(a.port)), os.O_WRONLY)
    try:
        os.write(pfd, HDR.pack(MAGIC, 1, KIND_REGION, 1, oid, size, 0, 1, gid, a.reply) + name.encode())
    finally:
        os.close(pfd)


def send_pool(a, obj, oid, gid, steps):
    """Put obj in a claimed pool region and send its descriptor. Returns the
    slot (release it after the ack), or None when the pool cannot be used
    (no access to the daemon's store, every slot taken)."""
    store = a.shm_dir or "/dev/shm/krfs-%d" % gid
    if not os.path.isdir(store):
        return None
    slot = claim_pool(a, store, len(obj))
    if slot is None:
        return None
    try:
        steps["t_region"] = time.time_ns()
        mv, off = memoryview(obj), 0
        while off < len(obj):
            off += os.pwrite(slot.fd, mv[off:], off)
        steps["t_filled"] = time.time_ns()
        send_descriptor(a, oid, len(obj), gid, slot.name)
    except BaseException:
        slot.release(len(obj))
        raise
    return slot


def send_region(a, obj, oid, gid, steps):
    """Put obj in a region of this node and send its descriptor; the
    region goes when the consumer's ack came (or the producer gave up)."""
    size = len(obj)
    name = "ho-%016x" % oid
    rpath = os.path.join(a.mount, "regions", name)
    fd = os.open(rpath, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, size)
        steps["t_region"] = time.time_ns()
        # The region's memory is a file of the daemon's store: write the
        # object there (one copy, as a socket's send); without access to
        # the store, write it through the mount.
        try:
            wfd = os.open(os.path.join(a.shm_dir or "/dev/shm/krfs-%d" % gid, name), os.O_WRONLY)
        except OSError:
            wfd = fd
        mv, off = memoryview(obj), 0
        while off < size:
            off += os.pwrite(wfd, mv[off:], off)
        if wfd != fd:
            os.close(wfd)
        steps["t_filled"] = time.time_ns()
    finally:
        os.close(fd)
    send_descriptor(a, oid, size, gid, name)
    return rpath


def cmd_recv(a):
    k = a.streams
    bound = []
    try:
        for t in range(k):
            bound.append(bind(a.mount, a.port + t))
    except BaseException:
        for path, fd in bound:
            os.unlink(path)
            os.close(fd)
        raise
    state = {"obj": None, "first": None, "got": set(), "t_first": None, "err": None, "via": "ports"}
    lock = threading.Lock()
    done = threading.Event()

    def reader(t, fd):
        # Each stream has a buffer of its own; a read returns one message.
        buf = bytearray(RECV_BUF)
        mv = memoryview(buf)
        mine = None  # how many chunks travel on this stream
        have = 0
        try:
            while mine is None or have < mine:
                n = recv(fd, buf)
                if done.is_set():
                    return
                if n < HDR.size:
                    raise HandoffError("short message (%d bytes)" % n)
                magic, ver, kind, streams, oid, size, idx, count, src, reply = HDR.unpack_from(buf)
                if magic == MAGIC and ver == 1 and kind == KIND_REGION and t == 0:
                    # A descriptor: the object waits in the producer's
                    # region; READ it from there.
                    state["t_first"], state["first"] = time.time_ns(), (oid, size, src, reply)
                    name = bytes(mv[HDR.size:n]).decode("ascii", "replace")
                    obj = pull_region(a.mount, src, name, size, k, a.piece, state)
                    state["obj"], state["t_done"] = obj, time.time_ns()
                    state["via"] = "pool" if name.startswith("ho-pool-") else "region"
                    done.set()
                    return
                if magic != MAGIC or ver != 1 or kind != KIND_CHUNK:
                    raise HandoffError("not a hand-off chunk")
                if not 1 <= streams <= k:
                    raise HandoffError("the producer uses %d streams, this consumer bound %d ports" % (streams, k))
                csize, ccount = chunking(size)
                if count != ccount or idx >= count or idx % streams != t:
                    raise HandoffError("chunk %d of %d does not fit an object of %d bytes on stream %d"
                                       % (idx, count, size, t))
                want = min(csize, size - idx * csize)
                if n - HDR.size != want:
                    raise HandoffError("chunk %d has %d bytes, want %d" % (idx, n - HDR.size, want))
                with lock:
                    if state["obj"] is None:
                        state["obj"], state["first"] = bytearray(size), (oid, size, src, reply)
                        state["t_first"] = time.time_ns()
                    elif (oid, size, src, reply) != state["first"]:
                        raise HandoffError("a chunk of another object arrived")
                    if idx in state["got"]:
                        raise HandoffError("chunk %d arrived twice" % idx)
                    obj = state["obj"]
                obj[idx * csize:idx * csize + want] = mv[HDR.size:n]
                with lock:
                    state["got"].add(idx)
                    if len(state["got"]) == count:
                        state["t_done"] = time.time_ns()
                        done.set()
                mine = len(range(t, count, streams))
                have += 1
        except BaseException as e:  # noqa: B902 - handed to the main thread
            if not done.is_set():
                state["err"] = e
                done.set()

    threads = [threading.Thread(target=reader, args=(t, fd), daemon=True) for t, (_, fd) in enumerate(bound)]
    try:
        for th in threads:
            th.start()
        print(json.dumps({"ready": True}), flush=True)
        if not done.wait(a.timeout):
            raise HandoffError("timed out after %d s" % a.timeout)
        if state["err"] is not None:
            raise state["err"]
        t_done = state["t_done"]
        obj = state["obj"]
        oid, size, src, reply = state["first"]
        count = chunking(size)[1] if state["via"] == "ports" else 1
        digest = hashlib.sha256(obj).digest()
        ack = HDR.pack(MAGIC, 1, KIND_ACK, 0, oid, size, 0, 0, 0, 0) + digest
        afd = os.open(os.path.join(a.mount, "peers", str(src), "ports", str(reply)), os.O_WRONLY)
        os.write(afd, ack)
        os.close(afd)
        if a.out:
            with open(a.out, "wb") as f:
                f.write(obj)
        print(json.dumps({"side": "recv", "mode": "krfs", "via": state["via"], "bytes": size, "chunks": count,
                          "streams": k, "t_open": state.get("t_open"),
                          "t_first": state["t_first"], "t_done": t_done, "sha256": digest.hex()}))
    finally:
        done.set()
        # Unbinding wakes the readers still waiting (streams that carried
        # no chunk): their read fails and they return.
        for path, _ in bound:
            os.unlink(path)
        for th in threads:
            th.join(1)
        for _, fd in bound:
            os.close(fd)


def cmd_send(a):
    obj = obj_of(a)
    size = len(obj)
    gid = a.gid or self_gid(a.mount)
    rpath, rfd = bind(a.mount, a.reply)
    region = None
    slot = None
    try:
        with_timeout(a.timeout)
        oid = int.from_bytes(os.urandom(8), "little")
        csize, count = chunking(size)
        k = min(a.streams, count)
        mv = memoryview(obj)
        errs = []

        def writer(t):
            try:
                fd = os.open(os.path.join(a.mount, "peers", str(a.to), "ports", str(a.port + t)), os.O_WRONLY)
                try:
                    for i in range(t, count, a.streams):
                        part = mv[i * csize:min(size, (i + 1) * csize)]
                        # One message per write(); the header is prepended
                        # in user space (one copy of the chunk here).
                        os.write(fd, HDR.pack(MAGIC, 1, KIND_CHUNK, a.streams, oid, size, i, count, gid, a.reply)
                                 + part)
                finally:
                    os.close(fd)
            except BaseException as e:  # noqa: B902 - handed to the main thread
                errs.append(e)

        via = a.via if a.via != "auto" else ("pool" if size >= REGION_MIN else "ports")
        steps = {}  # when each step of a region hand-off ended
        t0 = time.time_ns()
        if via == "pool":
            slot = send_pool(a, obj, oid, gid, steps)
            if slot is None:
                if a.via == "pool":
                    raise HandoffError("no pool slot: the daemon's store (--shm-dir) is not reachable "
                                       "or all %d slots are taken" % POOL_SLOTS)
                via = "region"  # auto: a region of its own
            count = 1
        if via == "pool":
            pass  # the descriptor is sent
        elif via == "region":
            region = send_region(a, obj, oid, gid, steps)
            count = 1
        elif k == 1:
            writer(0)
        else:
            # One writer per stream: while one chunk's rendezvous READ is
            # on the wire, the next is announced on another port.
            threads = [threading.Thread(target=writer, args=(t,)) for t in range(k)]
            for th in threads:
                th.start()
            for th in threads:
                th.join()
        t_sent = time.time_ns()
        if errs:
            raise errs[0]
        abuf = bytearray(ACK_BUF)
        ack = bytes(abuf[:recv(rfd, abuf)])
        if region:
            os.unlink(region)
            region = None
        t_acked = time.time_ns()
        if slot:
            # Clean-up, after the hand-off: zero what it held, free the slot.
            slot.release(size)
            slot = None
        signal.alarm(0)
        digest = hashlib.sha256(obj).digest()
        ok = (len(ack) == HDR.size + 32 and ack[:4] == MAGIC and HDR.unpack_from(ack)[2] == KIND_ACK
              and HDR.unpack_from(ack)[4] == oid and ack[HDR.size:] == digest)
        print(json.dumps({"side": "send", "mode": "krfs", "via": via, "bytes": size, "chunks": count, "streams": k,
                          "t_start": t0, "t_sent": t_sent, "t_acked": t_acked, "sha256": digest.hex(),
                          "identical": ok, **steps}))
        if not ok:
            raise HandoffError("the consumer's digest differs: the object was not handed off intact")
    finally:
        if slot:
            slot.release(size)
        if region:
            os.unlink(region)
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
    q.add_argument("--streams", type=int, default=STREAMS,
                   help="ports PORT .. PORT+STREAMS-1; reads in flight from a region (default %(default)s)")
    q.add_argument("--piece", type=int, default=PIECE, help="bytes per read from a region (default %(default)s)")
    q = sub.add_parser("send", help="krfs producer")
    q.add_argument("--mount", required=True)
    q.add_argument("--to", type=int, required=True, help="the consumer's gid")
    q.add_argument("--port", type=int, required=True, help="the consumer's port")
    q.add_argument("--reply", type=int, required=True, help="this producer's port for the ack")
    q.add_argument("--gid", type=int, default=0, help="this host's gid (default: read from MOUNT/stats)")
    q.add_argument("--streams", type=int, default=STREAMS,
                   help="chunks go round-robin to ports PORT .. PORT+STREAMS-1, one writer each (default %(default)s)")
    q.add_argument("--via", choices=("auto", "ports", "region", "pool"), default="auto",
                   help="ports: chunks as messages; region: the object in a new region of this node, "
                   "a descriptor to the consumer, which READs it; pool: the same through a reused region "
                   "of this host's hand-off pool (needs the store, --shm-dir); auto: from %d KiB the pool, "
                   "or a new region without the store or a free slot" % (REGION_MIN >> 10))
    q.add_argument("--shm-dir", help="this node's region store (krfs mount --shm-dir; default /dev/shm/krfs-GID)")
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
    if getattr(a, "streams", 1) < 1 or getattr(a, "streams", 1) > 64:
        p.error("--streams: 1 to 64")
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
