package dct

import (
	"errors"
	"fmt"
	"time"

	"github.com/krfs/krfs/verbs"
)

// Pool defaults.
const (
	// DefaultDCIs is the pool size; see the package doc for why.
	DefaultDCIs = 16
	// DefaultDepth is each DCI's send queue depth.
	DefaultDepth = 256
	// DefaultQuota is the WRs a peer may post on its DCI in one turn while
	// other peers wait (UCX's dc_tx_quota default is 32).
	DefaultQuota = 32
	// DefaultRetryCnt is the transport retry count of a DCI. Together with
	// PoolConfig.PeerTimeout it sets the per-try ACK timeout.
	DefaultRetryCnt = 7
	// DefaultRNRRetry bounds RNR retries. It is finite on purpose: with
	// infinite RNR retries a peer that never posts receives would hold a
	// DCI forever; qpcore retries the message itself instead.
	DefaultRNRRetry = 6
)

// PoolConfig sizes and tunes a DCI pool. Zero fields take the defaults.
type PoolConfig struct {
	DCIs        int
	Depth       int
	MaxRdAtomic int
	// PeerTimeout is how long a WR to a silent target may wait before it
	// completes with a retry-exceeded error: the DCI's ACK timeout is
	// PeerTimeout / (RetryCnt + 1). Default 1 s.
	PeerTimeout time.Duration
	RetryCnt    int
	RNRRetry    int
}

func (c *PoolConfig) setDefaults() {
	if c.DCIs <= 0 {
		c.DCIs = DefaultDCIs
	}
	if c.Depth <= 0 {
		c.Depth = DefaultDepth
	}
	if c.PeerTimeout <= 0 {
		c.PeerTimeout = time.Second
	}
	if c.RetryCnt <= 0 || c.RetryCnt > 7 {
		c.RetryCnt = DefaultRetryCnt
	}
	if c.RNRRetry <= 0 || c.RNRRetry > 7 {
		c.RNRRetry = DefaultRNRRetry
	}
}

// AckTimeout is the per-try ACK timeout a QP needs for retries to give up
// after about total: total / (retryCnt + 1), at least 1 ms.
func AckTimeout(total time.Duration, retryCnt int) time.Duration {
	return max(total/time.Duration(retryCnt+1), time.Millisecond)
}

// Pool is a node's fixed set of DCIs, all sending to one CQ. Its methods
// may be called concurrently; assignment is the Arbiter's business.
type Pool struct {
	cfg  PoolConfig
	qps  []verbs.QP
	attr verbs.QPAttr
}

// NewPool creates cfg.DCIs DCIs on pd, completing into sendCQ, and brings
// them to RTS.
func NewPool(pd verbs.PD, sendCQ verbs.CQ, cfg PoolConfig) (*Pool, error) {
	cfg.setDefaults()
	p := &Pool{cfg: cfg, attr: verbs.QPAttr{
		Timeout:  AckTimeout(cfg.PeerTimeout, cfg.RetryCnt),
		RetryCnt: cfg.RetryCnt,
		RNRRetry: cfg.RNRRetry,
	}}
	for range cfg.DCIs {
		q, err := pd.CreateQP(verbs.QPConfig{Type: verbs.DCI, SendCQ: sendCQ,
			Caps: verbs.QPCaps{MaxSendWR: cfg.Depth, MaxRdAtomic: cfg.MaxRdAtomic}})
		if err != nil {
			p.Close()
			return nil, fmt.Errorf("dct: creating DCI: %w", err)
		}
		p.qps = append(p.qps, q)
		if err := p.toRTS(q); err != nil {
			p.Close()
			return nil, err
		}
	}
	return p, nil
}

func (p *Pool) toRTS(q verbs.QP) error {
	for _, st := range []verbs.QPState{verbs.StateInit, verbs.StateRTR, verbs.StateRTS} {
		a := p.attr
		a.State = st
		if err := q.Modify(a); err != nil {
			return fmt.Errorf("dct: DCI %d to %v: %w", q.QPN(), st, err)
		}
	}
	return nil
}

// Len is the number of DCIs.
func (p *Pool) Len() int { return len(p.qps) }

// QP returns DCI i.
func (p *Pool) QP(i int) verbs.QP { return p.qps[i] }

// Depth is each DCI's send queue depth.
func (p *Pool) Depth() int { return p.cfg.Depth }

// Config is the pool's configuration with defaults applied.
func (p *Pool) Config() PoolConfig { return p.cfg }

// Recover brings DCI i from any state (normally ERR, after every
// outstanding WR completed) back to RTS: RESET, INIT, RTR, RTS. Its QPN
// stays; its PSNs run on, so targets see a new DC session.
func (p *Pool) Recover(i int) error {
	q := p.qps[i]
	if err := q.Modify(verbs.QPAttr{State: verbs.StateReset}); err != nil {
		return fmt.Errorf("dct: DCI %d to RESET: %w", q.QPN(), err)
	}
	return p.toRTS(q)
}

// Close destroys every DCI. Outstanding WRs are dropped without
// completions.
func (p *Pool) Close() error {
	var errs []error
	for _, q := range p.qps {
		if err := q.Destroy(); err != nil && !errors.Is(err, verbs.ErrDestroyed) {
			errs = append(errs, err)
		}
	}
	p.qps = nil
	return errors.Join(errs...)
}
