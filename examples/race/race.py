#!/usr/bin/env python3
"""race.py: a RACE-hashing-style disaggregated key-value store on krfs files.

Memory nodes are passive: the table lives in a region of each (the default
region "mem" unless --region says otherwise) and nothing runs on them.
Compute nodes reach it through their own krfs mount with plain file I/O:

  bucket reads       os.pread  on MOUNT/peers/<gid>/mem   one-sided READs
  slot claims        CAS ioctl on the same file           compare-and-swap
  block allocation   FAA ioctl on the header's alloc word fetch-and-add
  key-value blocks   os.pwrite, out of place              one-sided WRITEs

Python 3 standard library only. Subcommands (see README.md):

  init   --mount M --nodes G,G,..   lay out an empty table on every memory node
  load   --mount M --nodes .. --keys K        insert key-0..key-K-1
  run    --mount M --nodes .. --client C --keys K   insert K keys of client C,
                                    then look every one of them up
  check  --mount M --nodes .. --keys K --clients C  every loaded and client key
                                    found with its value, no slot lost
  lookup --mount M --nodes .. KEY   bootstrap a client and serve one lookup;
                                    prints timings as JSON
  serve  --local FILE --port P      the TCP baseline: a server holding one
                                    memory node's table (reads FILE locally)
  tcplookup --servers H:P,.. KEY    bootstrap a TCP client: connect to every
                                    server and serve one lookup; JSON timings

Layout of a memory node's region (little endian):

  0    header, 64 B: magic "RACEKV01", nbuckets u32, slots u32 (8),
       nodes u32, index u32, kv_base u64, kv_end u64, alloc u64 (offset 40,
       bumped with FAA), 16 B reserved
  64   nbuckets buckets of 8 slots of 8 bytes
  kv_base .. kv_end   key-value blocks, 64-byte aligned, written once

A slot is 0 when free, else fp u8 (bits 56-63) | blocks u8 (bits 48-55,
length of the key-value block in 64-byte units) | offset (bits 0-47).
A key-value block: klen u16, 0 u16, vlen u32, crc32(key+value) u32, 0 u32,
key, value, zero padding.

A key hashes (crc32) to one memory node and two candidate buckets there; a
lookup READs both buckets and then the block of every slot whose
fingerprint matches, and checks key and crc. An insert allocates a block
(FAA of a 16 KiB chunk on the node's alloc word, then carved locally),
WRITEs it, READs both buckets and CASes a free slot from 0 to the new slot
word (an update CASes the old word to the new one); a failed CAS means
another client got there first: read again and retry.
"""

import argparse
import fcntl
import json
import os
import socket
import struct
import sys
import time
import zlib

T_START = time.perf_counter_ns()  # as early as the interpreter lets us

# krfs ioctls (fs/fs.go): _IOWR('k', nr, 32) with a 32-byte argument
# {offset, a, b, old} of u64s in host byte order.
IOCTL_FAA = (3 << 30) | (32 << 16) | (ord("k") << 8) | 1
IOCTL_CAS = (3 << 30) | (32 << 16) | (ord("k") << 8) | 2
_ARG = struct.Struct("=QQQQ")

MAGIC = b"RACEKV01"
HDR = struct.Struct("<8sIIIIQQQ16x")  # 64 bytes
ALLOC_OFF = 40
SLOTS = 8
BUCKET = SLOTS * 8
KVHDR = struct.Struct("<HHIII")  # 16 bytes
CHUNK = 16 << 10
SEED2 = 0x9E3779B9


class RaceError(Exception):
    pass


def atomic(fd, cmd, off, a, b=0):
    """One krfs atomic ioctl on fd; returns the word's old value."""
    buf = bytearray(_ARG.pack(off, a, b, 0))
    fcntl.ioctl(fd, cmd, buf, True)
    return _ARG.unpack(buf)[3]


def hashes(key, nodes):
    """(node index, bucket seed 1, bucket seed 2, fingerprint) of a key."""
    h1 = zlib.crc32(key)
    h2 = zlib.crc32(key, SEED2)
    return h1 % nodes, h1 // nodes, h2, (h2 >> 24) & 0xFF


def kv_block(key, value):
    body = KVHDR.pack(len(key), 0, len(value), zlib.crc32(key + value), 0) + key + value
    pad = -len(body) % 64
    return body + b"\0" * pad


def parse_block(b):
    """(key, value) of a block, or None if it is torn or not a block."""
    if len(b) < KVHDR.size:
        return None
    klen, _, vlen, crc, _ = KVHDR.unpack_from(b)
    end = KVHDR.size + klen + vlen
    if end > len(b):
        return None
    key = bytes(b[KVHDR.size:KVHDR.size + klen])
    val = bytes(b[KVHDR.size + klen:end])
    if zlib.crc32(key + val) != crc:
        return None
    return key, val


def slot_word(fp, blocks, off):
    return (fp << 56) | (blocks << 48) | off


def slot_fields(w):
    return w >> 56, (w >> 48) & 0xFF, w & ((1 << 48) - 1)


class Node:
    """One memory node's table, reached through one open file (a VQP)."""

    def __init__(self, path):
        self.path = path
        # No fstat: the table header says where everything is, and a
        # stat costs a FUSE GETATTR per node once the attributes (1 s)
        # have expired.
        self.fd = os.open(path, os.O_RDWR)
        self.hdr = None
        self.chunk = (0, 0)  # [next, end) of this client's allocation chunk
        self.faas = 0

    def read_header(self):
        b = os.pread(self.fd, HDR.size, 0)
        magic, nb, slots, nodes, idx, kv_base, kv_end, _ = HDR.unpack(b)
        if magic != MAGIC or slots != SLOTS:
            raise RaceError("%s: no table (run init first)" % self.path)
        self.hdr = (nb, nodes, idx, kv_base, kv_end)
        return self.hdr

    def pread(self, n, off):
        b = os.pread(self.fd, n, off)
        if len(b) != n:
            raise RaceError("%s: short read at %d" % (self.path, off))
        return b

    def alloc(self, size):
        nxt, end = self.chunk
        if nxt + size > end:
            nb, _, _, kv_base, kv_end = self.hdr
            want = max(CHUNK, size)
            got = atomic(self.fd, IOCTL_FAA, ALLOC_OFF, want)
            self.faas += 1
            if kv_base + got + want > kv_end:
                raise RaceError("%s: key-value area full" % self.path)
            nxt, end = kv_base + got, kv_base + got + want
        self.chunk = (nxt + size, end)
        return nxt

    def close(self):
        os.close(self.fd)


class Table:
    """The whole store: one Node per memory node, in --nodes order."""

    def __init__(self, paths):
        self.nodes = [Node(p) for p in paths]
        self.stats = {"reads": 0, "writes": 0, "cas": 0, "cas_lost": 0}

    def counters(self):
        return dict(self.stats, faa=sum(n.faas for n in self.nodes))

    def open(self):
        for n in self.nodes:
            n.read_header()
            if n.hdr[1] != len(self.nodes):
                raise RaceError("%s: table laid out for %d nodes, %d given" % (n.path, n.hdr[1], len(self.nodes)))

    def locate(self, key):
        i, s1, s2, fp = hashes(key, len(self.nodes))
        node = self.nodes[i]
        nb = node.hdr[0]
        b1 = s1 % nb
        b2 = s2 % nb
        if b2 == b1:
            b2 = (b1 + 1) % nb
        return node, (64 + b1 * BUCKET, 64 + b2 * BUCKET), fp

    def read_buckets(self, node, offs):
        out = []
        for off in offs:
            b = node.pread(BUCKET, off)
            self.stats["reads"] += 1
            out.append((off, struct.unpack("<8Q", b)))
        return out

    def find(self, node, buckets, key, fp):
        """(slot offset, word, value) of key in the buckets, or None."""
        for off, words in buckets:
            for k, w in enumerate(words):
                if w == 0:
                    continue
                f, blocks, boff = slot_fields(w)
                if f != fp:
                    continue
                kv = parse_block(node.pread(blocks * 64, boff))
                self.stats["reads"] += 1
                if kv is not None and kv[0] == key:
                    return off + 8 * k, w, kv[1]
        return None

    def get(self, key):
        node, offs, fp = self.locate(key)
        hit = self.find(node, self.read_buckets(node, offs), key, fp)
        return None if hit is None else hit[2]

    def put(self, key, value):
        """Insert or update key; returns "insert" or "update"."""
        node, offs, fp = self.locate(key)
        block = kv_block(key, value)
        if len(block) > 255 * 64:
            raise RaceError("key-value block of %d bytes is too large (max %d)" % (len(block), 255 * 64))
        boff = node.alloc(len(block))
        os.pwrite(node.fd, block, boff)  # out of place: nobody points at it yet
        self.stats["writes"] += 1
        new = slot_word(fp, len(block) // 64, boff)
        for _ in range(1000):
            buckets = self.read_buckets(node, offs)
            hit = self.find(node, buckets, key, fp)
            if hit is not None:
                soff, old, _ = hit
                expect, kind = old, "update"
            else:
                free = [(off + 8 * k) for off, words in sorted(buckets, key=lambda b: sum(1 for w in b[1] if w))
                        for k, w in enumerate(words) if w == 0]
                if not free:
                    raise RaceError("both buckets of %r are full (make the table larger)" % key)
                soff, expect, kind = free[0], 0, "insert"
            got = atomic(node.fd, IOCTL_CAS, soff, expect, new)
            self.stats["cas"] += 1
            if got == expect:
                return kind
            self.stats["cas_lost"] += 1
        raise RaceError("gave up on %r after 1000 lost CAS" % key)

    def slots_used(self):
        n = 0
        for node in self.nodes:
            nb = node.hdr[0]
            off = 64
            end = 64 + nb * BUCKET
            while off < end:
                b = node.pread(min(end - off, 1 << 19), off)
                n += sum(1 for w in struct.unpack("<%dQ" % (len(b) // 8), b) if w)
                off += len(b)
        return n

    def close(self):
        for n in self.nodes:
            n.close()


def region_paths(mount, gids, region):
    sub = "mem" if region == "mem" else os.path.join("mr", region)
    return [os.path.join(mount, "peers", str(g), sub) for g in gids]


def value_of(key, size):
    """The value a writer stores for key: deterministic, so readers check it."""
    seed = zlib.crc32(key).to_bytes(4, "little")
    return (key + b"|" + seed * (size // 4 + 1))[:size]


def loaded_key(i):
    return b"key-%08d" % i


def client_key(c, i):
    return b"c%03d-key-%08d" % (c, i)


# ---- subcommands --------------------------------------------------------

def cmd_init(a):
    paths = region_paths(a.mount, a.gids, a.region)
    for idx, p in enumerate(paths):
        fd = os.open(p, os.O_RDWR)
        size = os.fstat(fd).st_size
        nb = a.buckets
        kv_base = (64 + nb * BUCKET + 4095) // 4096 * 4096
        if kv_base + CHUNK > size:
            raise RaceError("%s: %d bytes cannot hold %d buckets and a key-value area" % (p, size, nb))
        # Zero the buckets, then publish the header last.
        off, zero = 64, bytes(1 << 19)
        while off < kv_base:
            off += os.pwrite(fd, zero[:kv_base - off], off)
        os.pwrite(fd, HDR.pack(MAGIC, nb, SLOTS, len(paths), idx, kv_base, size, 0), 0)
        os.close(fd)
    print("table: %d memory nodes x %d buckets x %d slots" % (len(paths), a.buckets, SLOTS))


def open_table(a):
    t = Table(region_paths(a.mount, a.gids, a.region))
    t.open()
    return t


def cmd_load(a):
    t = open_table(a)
    t0 = time.perf_counter()
    for i in range(a.keys):
        k = loaded_key(i)
        if t.put(k, value_of(k, a.value_size)) != "insert":
            raise RaceError("load: %r already present (init the table first)" % k)
    dt = time.perf_counter() - t0
    print(json.dumps({"loaded": a.keys, "seconds": round(dt, 3),
                      "us_per_insert": round(dt / max(a.keys, 1) * 1e6, 1), **t.counters()}))


def cmd_run(a):
    t = open_table(a)
    t0 = time.perf_counter()
    for i in range(a.keys):
        k = client_key(a.client, i)
        t.put(k, value_of(k, a.value_size))
    t1 = time.perf_counter()
    missing = [i for i in range(a.keys) if t.get(client_key(a.client, i)) != value_of(client_key(a.client, i), a.value_size)]
    t2 = time.perf_counter()
    # Also read a sample of the loaded keys, as a client would.
    for i in range(0, a.loaded, max(1, a.loaded // 200)):
        k = loaded_key(i)
        if t.get(k) != value_of(k, a.value_size):
            missing.append(k.decode())
    out = {"client": a.client, "inserted": a.keys, "insert_us": round((t1 - t0) / max(a.keys, 1) * 1e6, 1),
           "lookup_us": round((t2 - t1) / max(a.keys, 1) * 1e6, 1), "missing": len(missing), **t.counters()}
    print(json.dumps(out))
    if missing:
        raise RaceError("client %d: %d keys missing or wrong, first %s" % (a.client, len(missing), missing[:5]))


def cmd_check(a):
    t = open_table(a)
    bad = []
    want = a.keys + a.clients * a.client_keys
    for i in range(a.keys):
        k = loaded_key(i)
        if t.get(k) != value_of(k, a.value_size):
            bad.append(k)
    for c in range(a.clients):
        for i in range(a.client_keys):
            k = client_key(c, i)
            if t.get(k) != value_of(k, a.value_size):
                bad.append(k)
    used = t.slots_used()
    print(json.dumps({"keys": want, "wrong_or_missing": len(bad), "slots_used": used}))
    if bad:
        raise RaceError("%d keys missing or wrong, first %s" % (len(bad), bad[:5]))
    if used != want:
        raise RaceError("%d slots used for %d keys: a slot was overwritten or duplicated" % (used, want))
    print("ok: all %d keys found with their values, %d slots for %d keys" % (want, used, want))


def cmd_lookup(a):
    """Bootstrap: open every memory node (a VQP each), read the headers, one lookup."""
    t_main = time.perf_counter_ns()
    t = Table(region_paths(a.mount, a.gids, a.region))
    t_open = time.perf_counter_ns()
    t.open()
    t_hdr = time.perf_counter_ns()
    v = t.get(a.key.encode())
    t_done = time.perf_counter_ns()
    if v is None:
        raise RaceError("key %r not found" % a.key)
    print(json.dumps({"mode": "krfs", "nodes": len(a.gids), "found": len(v),
                      "interp_us": (t_main - T_START) / 1e3, "open_us": (t_open - t_main) / 1e3,
                      "headers_us": (t_hdr - t_open) / 1e3, "lookup_us": (t_done - t_hdr) / 1e3,
                      "bootstrap_us": (t_done - t_main) / 1e3, "wall_ns": time.time_ns()}))


# TCP baseline: length-prefixed key in, status u32 + length-prefixed value out.

def recv_exact(s, n):
    b = bytearray()
    while len(b) < n:
        c = s.recv(n - len(b))
        if not c:
            raise RaceError("connection closed")
        b += c
    return bytes(b)


class LocalTable(Table):
    """A TCP server's view: one memory node's table through its local region file."""

    def __init__(self, path, nodes):
        super().__init__([path])
        self.n = nodes

    def open(self):
        self.nodes[0].read_header()

    def locate(self, key):
        node = self.nodes[0]
        _, s1, s2, fp = hashes(key, self.n)
        nb = node.hdr[0]
        b1, b2 = s1 % nb, s2 % nb
        if b2 == b1:
            b2 = (b1 + 1) % nb
        return node, (64 + b1 * BUCKET, 64 + b2 * BUCKET), fp


def cmd_serve(a):
    fd = os.open(a.local, os.O_RDONLY)
    magic, _, _, nodes, _, _, _, _ = HDR.unpack(os.pread(fd, HDR.size, 0))
    os.close(fd)
    if magic != MAGIC:
        raise RaceError("%s: no table" % a.local)
    t = LocalTable(a.local, nodes)
    t.open()
    ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind((a.bind, a.port))
    ls.listen(128)
    print("serving %s on %s:%d" % (a.local, a.bind, a.port), flush=True)
    import threading

    def conn(s):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while True:
                try:
                    n = struct.unpack("<I", recv_exact(s, 4))[0]
                except RaceError:
                    return
                v = t.get(recv_exact(s, n))
                if v is None:
                    s.sendall(struct.pack("<II", 1, 0))
                else:
                    s.sendall(struct.pack("<II", 0, len(v)) + v)
        finally:
            s.close()

    while True:
        s, _ = ls.accept()
        threading.Thread(target=conn, args=(s,), daemon=True).start()


def cmd_tcplookup(a):
    t_main = time.perf_counter_ns()
    socks = []
    for hp in a.servers.split(","):
        h, p = hp.rsplit(":", 1)
        s = socket.create_connection((h, int(p)))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        socks.append(s)
    t_conn = time.perf_counter_ns()
    key = a.key.encode()
    i, _, _, _ = hashes(key, len(socks))
    socks[i].sendall(struct.pack("<I", len(key)) + key)
    st, n = struct.unpack("<II", recv_exact(socks[i], 8))
    v = recv_exact(socks[i], n)
    t_done = time.perf_counter_ns()
    if st != 0:
        raise RaceError("key %r not found" % a.key)
    print(json.dumps({"mode": "tcp", "nodes": len(socks), "found": len(v),
                      "interp_us": (t_main - T_START) / 1e3, "open_us": (t_conn - t_main) / 1e3,
                      "headers_us": 0, "lookup_us": (t_done - t_conn) / 1e3,
                      "bootstrap_us": (t_done - t_main) / 1e3, "wall_ns": time.time_ns()}))
    for s in socks:
        s.close()


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)

    def table_args(q):
        q.add_argument("--mount", required=True, help="this host's krfs mount directory")
        q.add_argument("--nodes", required=True, help="gids of the memory nodes, comma separated, same order everywhere")
        q.add_argument("--region", default="mem", help="region holding the table (default: mem, the default region)")
        q.add_argument("--value-size", type=int, default=64, help="bytes per value (default 64)")

    q = sub.add_parser("init", help="lay out an empty table")
    table_args(q)
    q.add_argument("--buckets", type=int, default=1024, help="buckets per memory node (8 slots each)")
    q = sub.add_parser("load", help="insert key-0 .. key-K-1")
    table_args(q)
    q.add_argument("--keys", type=int, required=True)
    q = sub.add_parser("run", help="a client: insert its keys, look them up")
    table_args(q)
    q.add_argument("--client", type=int, required=True)
    q.add_argument("--keys", type=int, required=True)
    q.add_argument("--loaded", type=int, default=0, help="how many keys the loader inserted (a sample is read)")
    q = sub.add_parser("check", help="verify every key")
    table_args(q)
    q.add_argument("--keys", type=int, required=True, help="keys inserted by load")
    q.add_argument("--clients", type=int, default=0)
    q.add_argument("--client-keys", type=int, default=0)
    q = sub.add_parser("lookup", help="bootstrap a client and serve one lookup")
    table_args(q)
    q.add_argument("key")
    q = sub.add_parser("serve", help="TCP baseline server for one memory node")
    q.add_argument("--local", required=True, help="the memory node's own region file (MOUNT/regions/mem)")
    q.add_argument("--bind", default="0.0.0.0")
    q.add_argument("--port", type=int, default=7000)
    q = sub.add_parser("tcplookup", help="bootstrap a TCP client and serve one lookup")
    q.add_argument("--servers", required=True, help="HOST:PORT of every memory node's server, in --nodes order")
    q.add_argument("key")
    a = p.parse_args(argv)
    if hasattr(a, "nodes"):
        try:
            a.gids = [int(g) for g in a.nodes.split(",") if g]
        except ValueError:
            p.error("--nodes: comma-separated gids, like 1,2,3")
        if not a.gids:
            p.error("--nodes: at least one gid")
    try:
        {"init": cmd_init, "load": cmd_load, "run": cmd_run, "check": cmd_check, "lookup": cmd_lookup,
         "serve": cmd_serve, "tcplookup": cmd_tcplookup}[a.cmd](a)
    except (RaceError, OSError) as e:
        print("race.py %s: %s" % (a.cmd, e), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
