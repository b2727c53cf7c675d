package dct

import (
	crand "crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/krfs/krfs/verbs"
)

// DefaultSRQDepth is the depth of the target's shared receive queue.
const DefaultSRQDepth = 256

// DefaultMinRNRTimer is the delay the DCT asks senders to wait when no
// receive is posted. softnic's 200 us default is shorter than a receiver
// needs to repost under load; 1 ms with DefaultRNRRetry retries gives a
// receiver about 6 ms before the sender sees an RNR error (and qpcore
// retries).
const DefaultMinRNRTimer = time.Millisecond

// NewKey returns a fresh, non-zero, unpredictable DC key.
func NewKey() uint64 {
	var b [8]byte
	for {
		if _, err := crand.Read(b[:]); err != nil {
			panic("dct: crypto/rand failed: " + err.Error())
		}
		if k := binary.LittleEndian.Uint64(b[:]); k != 0 {
			return k
		}
	}
}

// TargetConfig configures a node's DC target. Zero fields take defaults.
type TargetConfig struct {
	// Key is the DC key the DCT checks; 0 draws one with NewKey.
	Key uint64
	// SRQDepth is the number of receive WRs the SRQ can hold.
	SRQDepth int
	// Access is what requests through the DCT may do; 0 means remote
	// read and write, and atomic on a device with atomics (each MR's own
	// flags still apply).
	Access verbs.Access
	// MinRNRTimer is the RNR delay asked of senders.
	MinRNRTimer time.Duration
	// NoDCT creates only the SRQ, for a device without DC transport: RC
	// QPs share it, DCTN is 0 and Key is 0 (what a node publishes to say
	// that it has no DCT).
	NoDCT bool
}

// Target is a node's DCT and the SRQ its SENDs land in. It is immutable
// after NewTarget; its methods may be called concurrently.
type Target struct {
	qp  verbs.QP
	srq verbs.SRQ
	key uint64
}

// NewTarget creates the DCT with its SRQ on pd, receive completions going
// to recvCQ, and brings it to RTR (a DCT serves in RTR).
func NewTarget(pd verbs.PD, recvCQ verbs.CQ, cfg TargetConfig) (*Target, error) {
	if cfg.Key == 0 {
		cfg.Key = NewKey()
	}
	if cfg.SRQDepth <= 0 {
		cfg.SRQDepth = DefaultSRQDepth
	}
	if cfg.Access == 0 {
		cfg.Access = verbs.AccessRemoteRead | verbs.AccessRemoteWrite
		if pd.Device().Attr().Atomic != verbs.AtomicNone {
			cfg.Access |= verbs.AccessRemoteAtomic
		}
	}
	if cfg.MinRNRTimer <= 0 {
		cfg.MinRNRTimer = DefaultMinRNRTimer
	}
	srq, err := pd.CreateSRQ(cfg.SRQDepth)
	if err != nil {
		return nil, fmt.Errorf("dct: creating SRQ: %w", err)
	}
	if cfg.NoDCT {
		return &Target{srq: srq}, nil
	}
	q, err := pd.CreateQP(verbs.QPConfig{Type: verbs.DCT, RecvCQ: recvCQ, SRQ: srq, DCKey: cfg.Key})
	if err != nil {
		srq.Destroy()
		return nil, fmt.Errorf("dct: creating DCT: %w", err)
	}
	t := &Target{qp: q, srq: srq, key: cfg.Key}
	if err := q.Modify(verbs.QPAttr{State: verbs.StateInit, Access: cfg.Access, MinRNRTimer: cfg.MinRNRTimer}); err != nil {
		t.Close()
		return nil, fmt.Errorf("dct: DCT to INIT: %w", err)
	}
	if err := q.Modify(verbs.QPAttr{State: verbs.StateRTR}); err != nil {
		t.Close()
		return nil, fmt.Errorf("dct: DCT to RTR: %w", err)
	}
	return t, nil
}

// DCTN is the DCT's number, which peers put in their DCTarget; 0 without
// a DCT. It is read after the DCT reached RTR (NewTarget returns only
// then): a NIC assigns a DCT its number in the INIT->RTR transition.
func (t *Target) DCTN() uint32 {
	if t.qp == nil {
		return 0
	}
	return t.qp.QPN()
}

// Key is the DC key.
func (t *Target) Key() uint64 { return t.key }

// QP is the DCT itself (nil without a DCT).
func (t *Target) QP() verbs.QP { return t.qp }

// SRQ is the shared receive queue of the DCT (RC QPs may share it too).
func (t *Target) SRQ() verbs.SRQ { return t.srq }

// Close destroys the DCT, then its SRQ.
func (t *Target) Close() error {
	var err1 error
	if t.qp != nil {
		err1 = t.qp.Destroy()
	}
	if errors.Is(err1, verbs.ErrDestroyed) {
		err1 = nil
	}
	err2 := t.srq.Destroy()
	if errors.Is(err2, verbs.ErrDestroyed) {
		err2 = nil
	}
	return errors.Join(err1, err2)
}
