package meta

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
)

// MaxRebuilds bounds how many times one operation is sent again on a new
// connection to the same server after its connection failed under it.
const MaxRebuilds = 4

// onServer runs op on cn, a connection to one server that the caller
// holds a reference to. If op fails because the connection died under it
// (a transport error: its QP went to ERR, say a SEND that ran out of
// retries while a host was starved of CPU), the client connects to the
// same server again, which rebuilds the QP, and runs op on the new
// connection, while ctx lasts and at most MaxRebuilds times. Other errors
// (a status from the server, an RPC timeout, ctx's end, a server that
// cannot be reached at all) are returned as they are.
//
// op must be safe to repeat, because the server may have executed the
// request whose reply was lost: a lookup, a heartbeat, a deregistration
// and a registration of a given incarnation are (a registration that
// asks for a gid gets the gid it was assigned before, see
// registry.register).
func (c *Client) onServer(ctx context.Context, cn *conn, op func(cn *conn) error) error {
	err := op(cn)
	s := c.servers[c.index(cn)]
	var rebuilt *conn // ours to unref
	defer func() {
		if rebuilt != nil {
			rebuilt.unref()
		}
	}()
	for try := 0; err != nil && cn.isDead() && try < MaxRebuilds && ctx.Err() == nil && !c.closed(); try++ {
		ncn, cerr := c.connect(ctx, s, false)
		if cerr != nil {
			break
		}
		if rebuilt != nil {
			rebuilt.unref()
		}
		rebuilt, cn = ncn, ncn
		c.st.rebuilds.Add(1)
		err = op(cn)
	}
	return err
}

// each runs f on live connections in order of preference until f
// reports done. If every live connection failed (or none was live), it
// connects to each server again (a restarted server, say) and tries
// those. It returns f's last error, or ErrUnreachable.
func (c *Client) each(ctx context.Context, f func(cn *conn) (done bool, err error)) error {
	if c.closed() {
		return ErrClosed
	}
	var last error
	tried := 0
	for pass := range 2 {
		var cns []*conn
		if pass == 0 {
			cns = c.liveConns()
		} else {
			var err error
			if cns, err = c.connectAll(ctx); len(cns) == 0 {
				last = err
			}
		}
		failed := false
		for i, cn := range cns {
			if tried > 0 {
				c.st.failovers.Add(1)
			}
			tried++
			done, err := f(cn)
			if done {
				for _, cn := range cns[i:] {
					cn.unref()
				}
				if err == nil {
					c.pref.Store(int32(c.index(cn)))
				}
				return err
			}
			cn.unref()
			if err != nil {
				failed = true
				last = err
				if ctx.Err() != nil {
					for _, cn := range cns[i+1:] {
						cn.unref()
					}
					return ctx.Err()
				}
			}
		}
		if len(cns) > 0 && !failed {
			break // every server answered; none had it
		}
	}
	switch {
	case last == nil:
		last = ErrUnreachable
	case errors.Is(last, context.Canceled) || errors.Is(last, context.DeadlineExceeded):
	case !errors.As(last, new(*Error)):
		// A connection request that timed out, a QP that failed: the
		// server is unreachable, and the error says so (and carries an
		// errno) whatever the verbs layer called it.
		last = fmt.Errorf("%w: %w", ErrUnreachable, last)
	}
	return last
}

// connectAll connects to every server that is down, all at once, and
// returns the live connections (with references) once every attempt
// ended, with the last connection error.
func (c *Client) connectAll(ctx context.Context) ([]*conn, error) {
	type result struct {
		cn  *conn
		err error
	}
	res := make([]result, len(c.servers))
	var wg sync.WaitGroup
	for i, s := range c.servers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res[i].cn, res[i].err = c.connect(ctx, s, false)
		}()
	}
	wg.Wait()
	var out []*conn
	var last error
	for _, r := range res {
		if r.err != nil {
			last = r.err
		} else {
			out = append(out, r.cn)
		}
	}
	return out, last
}

// liveConns returns the live connections in order of preference, with
// references.
func (c *Client) liveConns() []*conn {
	var out []*conn
	p := int(c.pref.Load())
	for i := range c.servers {
		if cn := c.servers[(p+i)%len(c.servers)].live(); cn != nil {
			out = append(out, cn)
		}
	}
	return out
}

func (c *Client) index(cn *conn) int {
	for i, s := range c.servers {
		if s.addr == cn.addr {
			return i
		}
	}
	return 0
}

func (c *Client) anyLive() *conn {
	for _, s := range c.servers {
		if cn := s.live(); cn != nil {
			return cn
		}
	}
	return nil
}

// ServerStatus describes one configured server as the client sees it.
type ServerStatus struct {
	Addr      netip.AddrPort
	Up        bool
	Bootstrap Bootstrap // of the current connection, when up
	LastErr   error     // of the last failed connection attempt
}

// Servers reports the state of each configured server.
func (c *Client) Servers() []ServerStatus {
	out := make([]ServerStatus, len(c.servers))
	for i, s := range c.servers {
		out[i].Addr = s.addr
		if cn := s.live(); cn != nil {
			out[i].Up, out[i].Bootstrap = true, cn.boot
			cn.unref()
		}
		s.mu.Lock()
		out[i].LastErr = s.lastErr
		s.mu.Unlock()
	}
	return out
}

// unreachable joins the errors of servers that did not answer into one
// that wraps ErrUnreachable, saying "unreachable" once.
func unreachable(errs []error) error {
	if len(errs) == 0 {
		return fmt.Errorf("%w: no server to ask", ErrUnreachable)
	}
	for _, err := range errs {
		if !errors.Is(err, ErrUnreachable) {
			return fmt.Errorf("%w: %w", ErrUnreachable, errors.Join(errs...))
		}
	}
	return errors.Join(errs...)
}
