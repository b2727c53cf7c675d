package main

import (
	"crypto/ed25519"
	"errors"
	"fmt"
	"os"

	"github.com/sirupsen/logrus"

	"github.com/krfs/krfs/internal/shm"
	"github.com/krfs/krfs/nic"
)

// A node's identity across restarts: its gid, its listen address and its
// key pair, which its region store records (shm.Identity). A mount
// without --gid looks for the store a node on the same --listen left
// (shm.FindIdentity) and asks the meta service for that gid again,
// re-exporting the store's regions; the meta service grants it if no live
// node holds it, or if the holder is this node's own key (a crash:
// its lease had not run out yet). A node keeps its key as long as its
// store lives; `krfs purge` forgets it.

// nodeID is what a mount starts its node with.
type nodeID struct {
	gid       uint32
	key       ed25519.PrivateKey
	reclaimed bool   // gid came from a store, not from --gid
	from      string // that store
}

// identityListen is the address a store's identity is matched against:
// --listen, or softnic's default.
func identityListen(f *mountFlags, backend nic.Backend) string {
	if f.listen != "" {
		return f.listen
	}
	if backend == nic.RDMA {
		return "" // derived from the RNIC's GID later: no match
	}
	return defaultSoftnicListen
}

// lookupIdentity finds what the node's store remembers: the store of
// --gid or --shm-dir, or without either the free store of a node that
// listened at the same address.
func lookupIdentity(f *mountFlags, backend nic.Backend) (id nodeID, err error) {
	var dir string
	switch {
	case f.shmDir != "":
		dir = f.shmDir
	case f.gid != 0:
		dir = storeDir("", uint32(f.gid))
	default:
		listen := identityListen(f, backend)
		if listen == "" {
			return id, nil
		}
		si, ok := shm.FindIdentity(listen)
		if !ok {
			return id, nil
		}
		return nodeID{gid: si.Identity.GID, key: si.Identity.Key, reclaimed: true, from: si.Dir}, nil
	}
	rem, err := shm.ReadIdentity(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nodeID{gid: uint32(f.gid)}, nil
	case err != nil:
		return id, err
	}
	id = nodeID{gid: uint32(f.gid), key: rem.Key, from: dir}
	if id.gid == 0 {
		id.gid, id.reclaimed = rem.GID, true
	}
	return id, nil
}

// nodeIdentity is lookupIdentity with a new key when none is remembered.
func nodeIdentity(log logrus.FieldLogger, f *mountFlags, backend nic.Backend) (nodeID, error) {
	id, err := lookupIdentity(f, backend)
	if err != nil {
		return id, fmt.Errorf("the node's store: %w", err)
	}
	if id.reclaimed {
		log.Infof("reclaiming gid %d, which %s remembers", id.gid, id.from)
	}
	if id.key == nil {
		if _, id.key, err = ed25519.GenerateKey(nil); err != nil {
			return id, err
		}
	}
	return id, nil
}

// knownGID is the gid the node will have, if known before it starts:
// --gid, or the gid its store remembers.
func knownGID(f *mountFlags) uint32 {
	if f.gid != 0 {
		return uint32(f.gid)
	}
	backend, err := nic.ParseBackend(f.backend)
	if err != nil {
		return 0
	}
	id, err := lookupIdentity(f, backend)
	if err != nil {
		return 0
	}
	return id.gid
}
