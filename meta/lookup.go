package meta

import (
	"context"
	"errors"
	"fmt"
	"sort"

	"github.com/krfs/krfs/verbs"
)

// Lookup returns gid's node: from the DCCache if there, otherwise with one
// READ of the table (or, with UseRPC, one RPC) at the first live server,
// going on to the others if a server fails or does not know gid.
func (c *Client) Lookup(ctx context.Context, gid uint32) (NodeInfo, error) {
	c.st.lookups.Add(1)
	if n, ok := c.cached(gid); ok {
		return n, nil
	}
	c.st.misses.Add(1)
	n, err := c.fetch(ctx, gid)
	if err != nil && !errors.Is(err, ErrNotFound) {
		c.knownMu.Lock()
		k, ok := c.known[gid]
		c.knownMu.Unlock()
		if ok {
			c.st.lastKnown.Add(1)
			return k, nil
		}
	}
	return n, err
}

// fetch reads gid from a server and caches it.
func (c *Client) fetch(ctx context.Context, gid uint32) (NodeInfo, error) {
	if gid == 0 {
		return NodeInfo{}, fmt.Errorf("%w: gid 0", ErrNotFound)
	}
	epoch := c.inval.Load()
	if !c.cfg.UseRPC {
		// The common case first: the preferred server answers.
		if cn := c.servers[c.pref.Load()].live(); cn != nil {
			var n NodeInfo
			var found bool
			err := c.onServer(ctx, cn, func(cn *conn) error {
				var err error
				n, found, err = cn.lookup(ctx, gid)
				return err
			})
			cn.unref()
			if err == nil && found {
				c.store(n, epoch)
				return n, nil
			}
			if err != nil {
				c.st.failovers.Add(1) // the others are tried below
			}
		}
	}
	var n NodeInfo
	notFound := false
	err := c.each(ctx, func(cn *conn) (bool, error) {
		var found bool
		err := c.onServer(ctx, cn, func(cn *conn) error {
			var err error
			if c.cfg.UseRPC {
				n, found, err = cn.lookupRPC(ctx, gid)
			} else {
				n, found, err = cn.lookup(ctx, gid)
			}
			return err
		})
		if err != nil {
			return false, err
		}
		if !found {
			notFound = true
			return false, nil
		}
		return true, nil
	})
	if err != nil {
		if notFound && ctx.Err() == nil {
			c.forget(gid)
			return NodeInfo{}, fmt.Errorf("%w: gid %d", ErrNotFound, gid)
		}
		return NodeInfo{}, fmt.Errorf("meta: lookup %d: %w", gid, err)
	}
	c.store(n, epoch)
	return n, nil
}

func (c *Client) store(n NodeInfo, epoch uint64) {
	if c.inval.Load() != epoch {
		return
	}
	if dc := c.dc.Load(); dc != nil {
		if out := c.front.put(n, epoch, c.cfg.CacheTTL); out != nil {
			flush(dc, out, c.inval.Load())
		}
	} else if c.cfg.CacheEntries > 0 {
		c.st.uncached.Add(1)
	}
	c.knownMu.Lock()
	if _, ok := c.known[n.GID]; ok || int64(len(c.known)) < max(c.cfg.CacheEntries, DefaultCacheEntries) {
		c.known[n.GID] = n
	}
	c.knownMu.Unlock()
}

// forget drops gid's last known entry.
func (c *Client) forget(gid uint32) {
	c.knownMu.Lock()
	delete(c.known, gid)
	c.knownMu.Unlock()
}

// LookupRPC asks a server for gid by RPC, bypassing the cache and the
// table: the baseline the one-sided path is measured against.
func (c *Client) LookupRPC(ctx context.Context, gid uint32) (NodeInfo, error) {
	var n NodeInfo
	notFound := false
	err := c.each(ctx, func(cn *conn) (bool, error) {
		var found bool
		err := c.onServer(ctx, cn, func(cn *conn) error {
			var err error
			n, found, err = cn.lookupRPC(ctx, gid)
			return err
		})
		if err != nil {
			return false, err
		}
		notFound = notFound || !found
		return found, nil
	})
	if err != nil {
		if notFound && ctx.Err() == nil {
			return NodeInfo{}, fmt.Errorf("%w: gid %d", ErrNotFound, gid)
		}
		return NodeInfo{}, fmt.Errorf("meta: lookup %d by RPC: %w", gid, err)
	}
	return n, nil
}

func (cn *conn) lookupRPC(ctx context.Context, gid uint32) (NodeInfo, bool, error) {
	rep, err := cn.call(ctx, message{kind: kindLookup, node: NodeInfo{GID: gid}})
	if err != nil {
		return NodeInfo{}, false, err
	}
	switch rep.status {
	case stOK:
		return rep.node, true, nil
	case stNotFound:
		return NodeInfo{}, false, nil
	}
	return NodeInfo{}, false, rep.status.err()
}

// LookupMany looks up several gids: cached ones from the DCCache; if the
// misses would take more READs than the table is worth, it READs the
// whole table once, otherwise one neighbourhood per miss. Gids that no
// server knows are absent from the result.
func (c *Client) LookupMany(ctx context.Context, gids []uint32) (map[uint32]NodeInfo, error) {
	out := make(map[uint32]NodeInfo, len(gids))
	var miss []uint32
	for _, g := range gids {
		c.st.lookups.Add(1)
		if n, ok := c.cached(g); ok {
			out[g] = n
			continue
		}
		c.st.misses.Add(1)
		miss = append(miss, g)
	}
	if len(miss) == 0 {
		return out, nil
	}
	if c.cfg.UseRPC || !c.tableCheaper(len(miss)) {
		for _, g := range miss {
			n, err := c.fetch(ctx, g)
			switch {
			case err == nil:
				out[g] = n
			case !errors.Is(err, ErrNotFound):
				return out, err
			}
		}
		return out, nil
	}
	all, err := c.list(ctx)
	if err != nil {
		return out, err
	}
	want := make(map[uint32]bool, len(miss))
	for _, g := range miss {
		want[g] = true
	}
	for _, n := range all {
		if want[n.GID] {
			out[n.GID] = n
		}
	}
	return out, nil
}

// tableCheaper reports whether one READ of the whole table moves fewer
// bytes than k neighbourhood READs.
func (c *Client) tableCheaper(k int) bool {
	cn := c.anyLive()
	if cn == nil {
		return false
	}
	defer cn.unref()
	return k*cn.geom.nbhdBytes() >= int(cn.boot.TableLen)
}

// List returns every registered node, sorted by gid, from one READ of a
// server's whole table (several READs in one doorbell for tables larger
// than ListChunk), and caches them all: the full-mesh bootstrap. Slots
// the READ caught in the middle of a write are read again one by one.
func (c *Client) List(ctx context.Context) ([]NodeInfo, error) {
	return c.list(ctx)
}

func (c *Client) list(ctx context.Context) ([]NodeInfo, error) {
	epoch := c.inval.Load()
	var all []NodeInfo
	err := c.each(ctx, func(cn *conn) (bool, error) {
		err := c.onServer(ctx, cn, func(cn *conn) error {
			var err error
			all, err = cn.list(ctx)
			return err
		})
		return err == nil, err
	})
	if err != nil {
		return nil, fmt.Errorf("meta: list: %w", err)
	}
	for _, n := range all {
		c.store(n, epoch)
	}
	return all, nil
}

// Invalidate drops gid from the DCCache.
func (c *Client) Invalidate(gid uint32) {
	c.inval.Add(1)
	c.st.inval.Add(1)
	c.front.del(gid)
	if dc := c.dc.Load(); dc != nil && c.front.flushed.Load() {
		dc.Del(gid)
	}
}

// cached returns gid's entry from the DCCache (its front, then ristretto).
func (c *Client) cached(gid uint32) (NodeInfo, bool) {
	dc := c.dc.Load()
	if dc == nil {
		return NodeInfo{}, false
	}
	if n, ok := c.front.get(gid); ok {
		return n, true
	}
	return dc.Get(gid)
}

// Stale is the data path's hook: failed is the metadata a work request
// just failed with, with a reason for which StaleReason is true (a DC key
// NAK or an unknown DCT: the peer restarted). Stale drops the cached
// entry and reads the table again. It returns the node's current entry if
// it differs from failed, ErrStale if the table still holds failed (the
// peer has not registered again yet; nothing is cached then), or
// ErrNotFound if the node is gone.
func (c *Client) Stale(ctx context.Context, failed NodeInfo) (NodeInfo, error) {
	c.Invalidate(failed.GID)
	c.forget(failed.GID)
	n, err := c.fetch(ctx, failed.GID)
	if err != nil {
		return n, err
	}
	if n == failed {
		c.Invalidate(failed.GID)
		return n, fmt.Errorf("%w: gid %d incarnation %#x", ErrStale, n.GID, n.Incarnation)
	}
	return n, nil
}

// StaleReason reports whether a work completion's reason means the
// peer's DC metadata is stale: its DCT rejected the DC key, or the DCT
// number no longer exists. Both happen when the peer restarted.
func StaleReason(r verbs.Reason) bool {
	return r == verbs.ReasonDCKey || r == verbs.ReasonNoQP
}

func sortNodes(ns []NodeInfo) {
	sort.Slice(ns, func(i, j int) bool { return ns[i].GID < ns[j].GID })
}
