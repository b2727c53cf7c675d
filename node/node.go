// Package node composes a krfs node: a NIC (any verbs.Device), a meta
// client (and, for a single-node cluster, an embedded meta server), a
// qpcore node registered with the meta service, and the shared-memory
// store its regions live in. It is what `krfs mount` runs under FUSE, and
// what the benchmark's API mode runs without it.
//
// A Node is also the filesystem's fs.Backend (backend.go), reports its
// resources in the shape of `rdma res show` (res.go), and feeds Prometheus
// (metrics.go).
//
// Start-up, in order: the meta client (after starting the embedded server
// if Config.Meta is empty), the qpcore node, registration with the meta
// service (which may assign the gid; SetGID makes qpcore use it), then the
// region store: regions an earlier run left in shared memory are mapped
// and exported again under new keys, and the default region "mem" is
// created if missing. Close undoes it in reverse.
package node

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/krfs/krfs/fs"
	"github.com/krfs/krfs/internal/shm"
	"github.com/krfs/krfs/meta"
	"github.com/krfs/krfs/qpcore"
	"github.com/krfs/krfs/verbs"
)

// DefaultStartTimeout bounds how long Start waits for the meta service.
const DefaultStartTimeout = 10 * time.Second

// DefaultMetaTimeout bounds one query of the meta service made for a
// listing (ResPeers, the stats file).
const DefaultMetaTimeout = time.Second

// Config describes a node.
type Config struct {
	// Device is the node's NIC. The node owns it from Start on: Close
	// closes it, and so does a Start that fails.
	Device verbs.Device
	// Meta lists the meta servers. Empty runs an embedded meta server on
	// Device, which other nodes join with Device's address.
	Meta []netip.AddrPort
	// QPCore configures the qpcore node (GID 0: assigned by the meta
	// service when registering). A zero MsgTimeout is PeerTimeout (or
	// qpcore.DefaultPeerTimeout): a message to a port is an operation on a
	// peer like a READ, and the node's timeout bounds it too, not
	// qpcore's longer DefaultMsgTimeout.
	QPCore qpcore.Config
	// NoRegister keeps the node out of the meta service: it reaches
	// others but nobody reaches it (a benchmark client). Such a node has
	// no region store either.
	NoRegister bool
	// MemSize is the size of the default region "mem"; 0 means no region
	// store at all (the node exports nothing).
	MemSize int64
	// ShmDir is the directory of the region files; empty is
	// shm.DefaultDir(gid) for a node of a cluster, and that name followed
	// by "-PORT" (the NIC's UDP port) for a single-node cluster (an
	// embedded meta service): every single-node cluster has the same gid,
	// and two on one host must not share their regions. One daemon at a
	// time holds a directory (shm.Open's lock): a second node on it fails
	// to start and says so.
	ShmDir string
	// StartTimeout bounds the wait for the meta service; 0 is
	// DefaultStartTimeout.
	StartTimeout time.Duration
	// MetaTimeout bounds one query of the meta service made for a listing
	// (ResPeers); 0 is DefaultMetaTimeout.
	MetaTimeout time.Duration
	// MaxRegionSize bounds one region (a create, truncate or write past
	// it fails with EFBIG); 0 is shm.MaxSize. The limit on the number of
	// regions is QPCore.MaxRegions (its region directory's capacity,
	// qpcore.DefaultMaxRegions by default): one region more fails with
	// ENOSPC and a log line, and leaves nothing behind.
	MaxRegionSize int64
	// NodeKey is the node's own key: the meta client proves it on every
	// connection, and the meta service binds the node's entry to it
	// (meta's auth.go). The region store records it with the gid and the
	// address (shm.Identity), for the next start. Nil: no key.
	NodeKey ed25519.PrivateKey
	// Reclaimed says that QPCore.GID is the gid a store remembers rather
	// than one the operator chose: if the meta service refuses it (another
	// node holds it), the node registers for an assigned gid instead.
	Reclaimed bool
}

// Node is a running node.
type Node struct {
	dev      verbs.Device
	core     *qpcore.Node
	meta     *meta.Client
	agent    *meta.Agent // nil with NoRegister
	store    *shm.Store  // nil without a region store
	srv      *meta.Server
	metaDesc string
	metaWait time.Duration // Config.MetaTimeout
	log      logrus.FieldLogger

	// regionMu serializes creating, resizing and removing regions, and is
	// read-held while local I/O touches a region's mapping, which a
	// resize replaces.
	regionMu      sync.RWMutex
	maxRegions    int
	maxRegionSize int64

	listedMu sync.Mutex      // guards listed
	listed   map[uint32]bool // the gids of the last Peers listing and of PeerInfo since

	// ioBufs is the filesystem's pool of I/O buffers, registered with
	// core (fs.BufferRegistrar); nil when no mount registered one, or
	// once it was unregistered (by the mount or by Close, whichever comes
	// first: the mount's unregistration may run after the node closed).
	// ioMu serializes the registration and both unregistrations; readers
	// (stats) only Load.
	ioMu   sync.Mutex
	ioBufs atomic.Pointer[fs.IOBuffers]
	// ioMem is the memory registered with RegisterMemory (the FUSE ring
	// entries' payload buffers), under ioMu and with the same rule.
	ioMem [][]byte
	// fuseStats reports the mount's FUSE transport (SetFuseStats).
	fuseStats atomic.Pointer[func() fs.FuseStats]

	closeOnce sync.Once
}

// ParseMeta parses a --meta list, HOST:PORT[,HOST:PORT...]; empty entries
// are skipped, so "" is an empty list.
func ParseMeta(s string) ([]netip.AddrPort, error) {
	var out []netip.AddrPort
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		ap, err := netip.ParseAddrPort(f)
		if err != nil {
			return nil, fmt.Errorf("--meta %q: want HOST:PORT[,HOST:PORT...]", s)
		}
		out = append(out, ap)
	}
	return out, nil
}

// afterRegister, if set (by a test), runs in Start once the node has
// registered with the meta service.
var afterRegister func()

// Start starts a node as cfg says; see the package doc for the sequence.
// ctx bounds the start (with cfg.StartTimeout).
func Start(ctx context.Context, cfg Config, log logrus.FieldLogger) (_ *Node, err error) {
	if cfg.Device == nil {
		return nil, fmt.Errorf("node: no device")
	}
	if cfg.StartTimeout <= 0 {
		cfg.StartTimeout = DefaultStartTimeout
	}
	if cfg.MetaTimeout <= 0 {
		cfg.MetaTimeout = DefaultMetaTimeout
	}
	cfg.QPCore = withMsgTimeout(cfg.QPCore)
	n := &Node{dev: cfg.Device, metaWait: cfg.MetaTimeout, log: log, maxRegions: cfg.QPCore.MaxRegions, maxRegionSize: cfg.MaxRegionSize}
	if n.maxRegions <= 0 {
		n.maxRegions = qpcore.DefaultMaxRegions
	}
	if n.maxRegionSize <= 0 || n.maxRegionSize > shm.MaxSize {
		n.maxRegionSize = shm.MaxSize
	}
	defer func() {
		if err != nil {
			n.Close()
		}
	}()
	dev := cfg.Device
	servers := cfg.Meta
	if len(servers) == 0 {
		// The single-node default: an embedded meta service on this NIC.
		if n.srv, err = meta.NewServer(dev, meta.ServerConfig{NoDC: cfg.QPCore.NoDC}); err != nil {
			return nil, fmt.Errorf("embedded meta service: %w", err)
		}
		servers = []netip.AddrPort{dev.Addr()}
		n.metaDesc = "embedded at " + dev.Addr().String()
	} else {
		n.metaDesc = fmt.Sprint(servers)
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.StartTimeout)
	defer cancel()
	err = n.untilAnswered(ctx, "connection", func() (err error) {
		n.meta, err = meta.NewClient(ctx, dev, meta.ClientConfig{Servers: servers, NodeKey: cfg.NodeKey})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("meta service %v unreachable: %w", servers, err)
	}
	if n.core, err = qpcore.NewNode(dev, n.meta, cfg.QPCore); err != nil {
		return nil, err
	}
	if cfg.NoRegister {
		return n, nil
	}
	// The region store's directory is named after the gid (unless
	// ShmDir names it). When the gid is known before registering (--gid,
	// or the gid a store remembers), the store is opened and its regions
	// exported again first: the new incarnation the meta service
	// publishes then has its whole directory, and a peer that looks the
	// node up again the moment it registered (its operations on the old
	// incarnation were refused) finds every region. Registered first, the
	// directory would be empty until the regions were exported again, and
	// such a peer would get ENOENT for them.
	storeDir := func(gid uint32) string {
		if cfg.ShmDir != "" {
			return cfg.ShmDir
		}
		dir := shm.DefaultDir(gid)
		if n.srv != nil {
			dir = fmt.Sprintf("%s-%d", dir, dev.Addr().Port())
		}
		return dir
	}
	early := ""
	if cfg.MemSize != 0 && (cfg.ShmDir != "" || cfg.QPCore.GID != 0) {
		early = storeDir(cfg.QPCore.GID)
		if err := n.startStore(early, cfg.MemSize); err != nil {
			return nil, err
		}
	}
	err = n.untilAnswered(ctx, "registration", func() (err error) {
		n.agent, err = n.meta.Register(ctx, n.core.Info(), meta.AgentConfig{})
		return err
	})
	if cfg.Reclaimed && (errors.Is(err, meta.ErrGIDInUse) || errors.Is(err, meta.ErrDenied)) {
		// The gid the store remembers is another node's now: take a new
		// one (and a new store; the old one stays, see krfs purge --list).
		n.log.Warnf("gid %d, which %s remembers, is held by another node (%v); registering for a new gid",
			cfg.QPCore.GID, storeName(cfg.ShmDir), err)
		info := n.core.Info()
		info.GID = 0
		err = n.untilAnswered(ctx, "registration", func() (err error) {
			n.agent, err = n.meta.Register(ctx, info, meta.AgentConfig{})
			return err
		})
	}
	if err != nil {
		if early != "" {
			n.dropStore(true)
		}
		return nil, fmt.Errorf("registering with the meta service: %w", err)
	}
	gid := n.agent.Info().GID
	n.core.SetGID(gid)
	if afterRegister != nil {
		afterRegister()
	}
	if cfg.MemSize == 0 {
		return n, nil
	}
	dir := storeDir(gid)
	if early != "" && dir != early {
		// Another gid than the store's: its regions are not this node's
		// (the store is kept for its gid, see krfs purge --list).
		n.dropStore(false)
		early = ""
	}
	if early == "" {
		if err := n.startStore(dir, cfg.MemSize); err != nil {
			return nil, err
		}
	}
	if err := n.store.SaveIdentity(shm.Identity{GID: gid, Listen: dev.Addr().String(), Key: cfg.NodeKey}); err != nil {
		n.log.Warnf("recording the node's identity in %s: %v", dir, err)
	}
	// Publish the default region's rkey and length in the meta entry:
	// a peer's first READ of "mem" then needs no directory READ. Not
	// fatal: without it peers read the directory first.
	if err := n.agent.Update(ctx, n.core.Info()); err != nil {
		n.log.Infof("publishing the default region in the meta entry: %v", err)
	}
	return n, nil
}

// withMsgTimeout gives c a MsgTimeout of its PeerTimeout if it has none.
func withMsgTimeout(c qpcore.Config) qpcore.Config {
	if c.MsgTimeout <= 0 {
		c.MsgTimeout = c.PeerTimeout
		if c.MsgTimeout <= 0 {
			c.MsgTimeout = qpcore.DefaultPeerTimeout
		}
	}
	return c
}

// startStore is openStore for Start: a store that fails to open leaves
// nothing behind (the directory it made goes with the regions in it).
func (n *Node) startStore(dir string, mem int64) error {
	if err := n.openStore(dir, mem); err != nil {
		if n.store != nil {
			n.dropStore(true)
		}
		return err
	}
	return nil
}

// dropStore unexports the regions of the store opened by startStore and
// closes it (discard: removes the directory too if this start made it).
func (n *Node) dropStore(discard bool) {
	if n.store == nil {
		return
	}
	for _, r := range n.core.Regions() {
		_ = n.core.Unexport(r.Name)
	}
	if discard {
		_ = n.store.Discard()
	} else {
		n.store.Close()
	}
	n.store = nil
}

// openStore opens the region store, exports again the regions an earlier
// run left in it (with their data, under new keys: peers find them
// through the new incarnation's directory), and creates "mem" if missing.
func (n *Node) openStore(dir string, mem int64) (err error) {
	if n.store, err = shm.Open(dir); err != nil {
		n.store = nil
		return err
	}
	names, err := n.store.Names()
	if err != nil {
		return err
	}
	for _, name := range names {
		r, err := n.store.Map(name, -1, 0, -1, -1)
		if err != nil {
			return err
		}
		m, u, g, _, _ := n.store.Stat(name)
		if _, err := n.export(r, uint32(m), uint32(u), uint32(g)); err != nil {
			return fmt.Errorf("re-exporting region %s: %w", name, err)
		}
		n.log.Infof("region %s (%d bytes) recovered from %s", name, len(r.Mem), dir)
	}
	if n.store.Get("mem") == nil {
		if _, err := n.Export("mem", mem, shm.DefaultMode, uint32(os.Getuid()), uint32(os.Getgid())); err != nil {
			return fmt.Errorf("default region: %w", err)
		}
	}
	return nil
}

// storeName names the store a reclaimed gid came from, for a log line.
func storeName(shmDir string) string {
	if shmDir != "" {
		return shmDir
	}
	return "the node's store"
}

// metaRetry paces Start's attempts to reach the meta service.
const metaRetry = 200 * time.Millisecond

// untilAnswered runs f, the connection to or the registration with the
// meta service, again while the service does not answer (it is not up
// yet, or busy or cut off for a moment) until ctx ends: the start's whole
// budget (StartTimeout), not one RPC's timeout, bounds the wait. Any other
// error ends it at once. A registration retried is the same registration:
// the node's incarnation is fixed, so one the server applied late is
// renewed, not doubled.
func (n *Node) untilAnswered(ctx context.Context, what string, f func() error) error {
	for try := 1; ; try++ {
		err := f()
		if err == nil || !(errors.Is(err, meta.ErrUnreachable) || errors.Is(err, meta.ErrLimited)) {
			return err
		}
		n.log.Infof("meta service did not answer %s attempt %d, trying again: %v", what, try, err)
		t := time.NewTimer(metaRetry)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
	}
}

// Close deregisters the node and stops everything Start started, the
// device included. The region files stay, for the next start to recover;
// Close after the first does nothing.
func (n *Node) Close() error {
	var err error
	n.closeOnce.Do(func() { err = n.close(false) })
	return err
}

// CloseAndDiscard is Close for a node whose mount failed: if this start
// created the region directory, it goes too, with the regions in it, so
// that a failed mount leaves nothing behind.
func (n *Node) CloseAndDiscard() error {
	var err error
	n.closeOnce.Do(func() { err = n.close(true) })
	return err
}

func (n *Node) close(discard bool) error {
	n.releaseIOBuffers(nil)
	n.releaseMemory(nil)
	if n.agent != nil {
		if err := n.agent.Close(); err != nil {
			n.log.Debugf("deregister: %v", err)
		}
	}
	if n.core != nil {
		n.core.Close()
	}
	if n.meta != nil {
		n.meta.Close()
	}
	if n.srv != nil {
		n.srv.Close()
	}
	if n.store != nil {
		if discard {
			if err := n.store.Discard(); err != nil {
				n.log.Warnf("removing %s: %v", n.store.Dir(), err)
			}
		} else {
			n.store.Close()
		}
	}
	return n.dev.Close()
}

// StoreDir is the directory of the node's region files ("" without a
// region store).
func (n *Node) StoreDir() string {
	if n.store == nil {
		return ""
	}
	return n.store.Dir()
}

// Purge frees region memory that no daemon holds: the region store in dir
// (every region file, the lock, the directory), or with dir "" every
// store under the default base (/dev/shm/krfs-*). A store a running
// daemon holds is skipped, and the error then names it (wrapping
// shm.ErrInUse). It returns the directories it removed. The regions'
// contents are lost: this is `krfs purge`.
func Purge(dir string) (removed []string, err error) {
	dirs := []string{dir}
	if dir == "" {
		if dirs, err = shm.Stores(); err != nil {
			return nil, err
		}
	}
	var errs []error
	for _, d := range dirs {
		if err := shm.Purge(d); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, d)
	}
	return removed, errors.Join(errs...)
}

// Device is the node's NIC.
func (n *Node) Device() verbs.Device { return n.dev }

// Core is the node's qpcore node.
func (n *Node) Core() *qpcore.Node { return n.core }

// Meta is the node's meta client (its resolver).
func (n *Node) Meta() *meta.Client { return n.meta }

// MetaDesc describes the meta service for logs: its servers, or where the
// embedded one runs.
func (n *Node) MetaDesc() string { return n.metaDesc }

// syncMemory makes the CPU's stores to exported memory visible to the
// NIC, for devices that need it (softnic's engine; a hardware NIC reads
// memory coherently).
func (n *Node) syncMemory() {
	if s, ok := n.dev.(interface{ SyncMemory() }); ok {
		s.SyncMemory()
	}
}
