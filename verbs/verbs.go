package verbs

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"
)

// Errors returned synchronously by the API. Backends wrap them with detail;
// test with errors.Is.
var (
	ErrInvalidArg   = errors.New("verbs: invalid argument")
	ErrNoMR         = errors.New("verbs: SGE names no registered memory region")
	ErrMRDead       = errors.New("verbs: memory region is deregistered")
	ErrWrongPD      = errors.New("verbs: object belongs to another protection domain")
	ErrBounds       = errors.New("verbs: SGE outside its memory region")
	ErrAccess       = errors.New("verbs: memory region lacks the required access flag")
	ErrLength       = errors.New("verbs: zero or oversized length")
	ErrAlign        = errors.New("verbs: atomic address not 8-byte aligned")
	ErrOpcode       = errors.New("verbs: opcode not supported on this QP type")
	ErrQPState      = errors.New("verbs: QP state does not allow this")
	ErrTransition   = errors.New("verbs: invalid QP state transition")
	ErrQueueFull    = errors.New("verbs: work queue full")
	ErrNoTarget     = errors.New("verbs: DCI work request without a DC target")
	ErrClosed       = errors.New("verbs: device closed")
	ErrDestroyed    = errors.New("verbs: object destroyed")
	ErrCMRejected   = errors.New("verbs: connection request rejected")
	ErrCMTimeout    = errors.New("verbs: connection request timed out")
	ErrNoSuchTarget = errors.New("verbs: no such QP or service on the remote device")
	ErrNotSupported = errors.New("verbs: not supported by this device")
)

// PostError reports which WR of a batch PostSend/PostRecv refused. WRs before
// Index were posted; WRs from Index on were not.
type PostError struct {
	Index int
	Err   error
}

func (e *PostError) Error() string { return fmt.Sprintf("verbs: WR %d: %v", e.Index, e.Err) }
func (e *PostError) Unwrap() error { return e.Err }

// Access are memory region access flags (IBV_ACCESS_*). Local read is always
// allowed.
type Access uint8

const (
	AccessLocalWrite Access = 1 << iota
	AccessRemoteRead
	AccessRemoteWrite
	AccessRemoteAtomic

	AccessAll = AccessLocalWrite | AccessRemoteRead | AccessRemoteWrite | AccessRemoteAtomic
)

func (a Access) String() string {
	b := []byte("----")
	if a&AccessLocalWrite != 0 {
		b[0] = 'w'
	}
	if a&AccessRemoteRead != 0 {
		b[1] = 'R'
	}
	if a&AccessRemoteWrite != 0 {
		b[2] = 'W'
	}
	if a&AccessRemoteAtomic != 0 {
		b[3] = 'A'
	}
	return string(b)
}

// QPType is the transport service of a QP.
type QPType uint8

const (
	RC  QPType = iota + 1 // reliable connected
	DCI                   // dynamically connected initiator: each WR names its target
	DCT                   // dynamically connected target: receives through an SRQ
)

func (t QPType) String() string {
	switch t {
	case RC:
		return "RC"
	case DCI:
		return "DCI"
	case DCT:
		return "DCT"
	}
	return fmt.Sprintf("QPType(%d)", uint8(t))
}

// QPState is a QP's state (IBV_QPS_*).
type QPState uint8

const (
	StateReset QPState = iota
	StateInit
	StateRTR
	StateRTS
	StateErr
)

func (s QPState) String() string {
	switch s {
	case StateReset:
		return "RESET"
	case StateInit:
		return "INIT"
	case StateRTR:
		return "RTR"
	case StateRTS:
		return "RTS"
	case StateErr:
		return "ERR"
	}
	return fmt.Sprintf("QPState(%d)", uint8(s))
}

// ValidTransition reports whether a QP of type t may move from one state
// to another, as mlx5 allows it (the kernel's ib_modify_qp_is_ok for RC,
// modify_dci_qp_is_ok for a DCI, mlx5_ib_modify_dct for a DCT):
//
//	RC:  RESET->INIT->RTR->RTS, INIT->INIT and RTS->RTS (attribute
//	     changes), any state to ERR and to RESET
//	DCI: the same, except RESET->ERR
//	DCT: RESET->INIT->RTR and nothing else: a DCT is destroyed, never
//	     moved to ERR or back to RESET
func ValidTransition(t QPType, from, to QPState) bool {
	if t == DCT {
		return from == StateReset && to == StateInit || from == StateInit && to == StateRTR
	}
	switch to {
	case StateReset:
		return true
	case StateErr:
		return t != DCI || from != StateReset
	case StateInit:
		return from == StateReset || from == StateInit
	case StateRTR:
		return from == StateInit
	case StateRTS:
		return from == StateRTR || from == StateRTS
	}
	return false
}

// Opcode is a send work request's operation.
type Opcode uint8

const (
	OpRead Opcode = iota + 1
	OpWrite
	OpWriteImm
	OpSend
	OpSendImm
	OpCmpSwap
	OpFetchAdd
	// OpRecv and OpRecvImm appear only in completions of receive WRs.
	OpRecv
	OpRecvWriteImm
)

func (o Opcode) String() string {
	switch o {
	case OpRead:
		return "READ"
	case OpWrite:
		return "WRITE"
	case OpWriteImm:
		return "WRITE_WITH_IMM"
	case OpSend:
		return "SEND"
	case OpSendImm:
		return "SEND_WITH_IMM"
	case OpCmpSwap:
		return "CMP_SWAP"
	case OpFetchAdd:
		return "FETCH_ADD"
	case OpRecv:
		return "RECV"
	case OpRecvWriteImm:
		return "RECV_RDMA_WITH_IMM"
	}
	return fmt.Sprintf("Opcode(%d)", uint8(o))
}

// IsAtomic reports whether o is CMP_SWAP or FETCH_ADD.
func (o Opcode) IsAtomic() bool { return o == OpCmpSwap || o == OpFetchAdd }

// SendFlags modify a send WR (IBV_SEND_*).
type SendFlags uint8

const (
	// Signaled asks for a completion on success. Errors complete always.
	Signaled SendFlags = 1 << iota
	// Fence makes the WR wait until all earlier READs and atomics of the
	// same QP completed.
	Fence
	// Inline copies the payload at post time; the SGE's MR is not needed
	// (InlineData is used instead).
	Inline
	// Solicited sets the solicited-event bit of a SEND.
	Solicited
)

// AtomicSize is the operand size of CMP_SWAP and FETCH_ADD.
const AtomicSize = 8

// SGE is a scatter/gather element: Length bytes at Offset of MR.
type SGE struct {
	MR     MR
	Offset uint64
	Length uint32
}

// Bytes returns the memory the SGE names, or nil if it is invalid.
func (s SGE) Bytes() []byte {
	if s.MR == nil {
		return nil
	}
	b := s.MR.Buf()
	if s.Offset > uint64(len(b)) || uint64(s.Length) > uint64(len(b))-s.Offset {
		return nil
	}
	return b[s.Offset : s.Offset+uint64(s.Length)]
}

// DCTarget names the DC target of a DCI work request: the remote device's
// address, the DCT's number, and the DC key the DCT checks.
type DCTarget struct {
	Addr  netip.AddrPort
	DCTN  uint32
	DCKey uint64
}

// SendWR is a send-queue work request.
type SendWR struct {
	ID    uint64
	Op    Opcode
	Flags SendFlags
	// Local is the data source (WRITE, SEND) or sink (READ, atomics: 8 bytes
	// receiving the original remote value).
	Local SGE
	// InlineData is the payload of an Inline WRITE or SEND.
	InlineData []byte
	// RemoteAddr and RKey name remote memory for READ, WRITE and atomics.
	RemoteAddr uint64
	RKey       uint32
	// CompareAdd is the compare value of CMP_SWAP or the addend of
	// FETCH_ADD; Swap is the swap value of CMP_SWAP.
	CompareAdd uint64
	Swap       uint64
	// Imm is the immediate data of *_WITH_IMM.
	Imm uint32
	// Target is required on a DCI and ignored elsewhere.
	Target *DCTarget
}

// RecvWR is a receive-queue work request.
type RecvWR struct {
	ID    uint64
	Local SGE
}

// Status is a work completion status (IBV_WC_*).
type Status uint8

const (
	StatusSuccess Status = iota
	StatusLocLenErr
	StatusLocProtErr
	StatusWRFlushErr
	StatusRemInvReqErr
	StatusRemAccessErr
	StatusRemOpErr
	StatusRetryExcErr
	StatusRNRRetryExcErr
)

func (s Status) String() string {
	switch s {
	case StatusSuccess:
		return "success"
	case StatusLocLenErr:
		return "local length error"
	case StatusLocProtErr:
		return "local protection error"
	case StatusWRFlushErr:
		return "WR flushed"
	case StatusRemInvReqErr:
		return "remote invalid request"
	case StatusRemAccessErr:
		return "remote access error"
	case StatusRemOpErr:
		return "remote operation error"
	case StatusRetryExcErr:
		return "transport retry counter exceeded"
	case StatusRNRRetryExcErr:
		return "RNR retry counter exceeded"
	}
	return fmt.Sprintf("Status(%d)", uint8(s))
}

// Reason refines an error status with the responder's reason, so that
// upper layers can tell, for example, a stale DC key (peer restarted) from
// a bad rkey.
type Reason uint8

const (
	ReasonNone       Reason = iota
	ReasonRKey              // unknown or deregistered rkey
	ReasonBounds            // range outside the MR
	ReasonPerm              // MR lacks the access flag
	ReasonAlign             // misaligned atomic
	ReasonDCKey             // DC key mismatch
	ReasonNoQP              // no such QP/DCT on the remote device
	ReasonRecvLen           // message longer than the posted receive buffer
	ReasonInvalidOp         // opcode not allowed by the remote QP
	ReasonRemoteDown        // retries exhausted
)

func (r Reason) String() string {
	switch r {
	case ReasonNone:
		return "none"
	case ReasonRKey:
		return "invalid rkey"
	case ReasonBounds:
		return "out of bounds"
	case ReasonPerm:
		return "permission denied"
	case ReasonAlign:
		return "misaligned atomic"
	case ReasonDCKey:
		return "DC key mismatch"
	case ReasonNoQP:
		return "no such QP"
	case ReasonRecvLen:
		return "receive buffer too small"
	case ReasonInvalidOp:
		return "invalid opcode"
	case ReasonRemoteDown:
		return "no response"
	}
	return fmt.Sprintf("Reason(%d)", uint8(r))
}

// WC is a work completion.
//
// Of a completion with an error status only ID, Status, Reason, QPN and
// VendorErr are defined: Op, ByteLen, Imm, HasImm, SrcAddr and SrcQPN are
// not (ibv_poll_cq(3); mlx5 leaves them as they were, softnic fills them
// with misleading values on purpose). Tell an error completion of a
// receive from one of a send by its ID or by the CQ it came from.
type WC struct {
	ID     uint64
	Status Status
	Reason Reason
	Op     Opcode
	QPN    uint32
	// ByteLen is the received length (receive WCs) or the transferred length.
	ByteLen uint32
	Imm     uint32
	HasImm  bool
	// Source identifies the sender of a received message: its device address
	// and QPN (for receives on DCT/SRQ, this is the DCI).
	SrcAddr netip.AddrPort
	SrcQPN  uint32
	// VendorErr is the NIC's own error syndrome of an error completion
	// (ibv_wc.vendor_err; 0 on softnic), for logs.
	VendorErr uint32
}

// Err returns nil for a successful completion and a descriptive error
// otherwise (it names the WR by ID: an error completion has no opcode).
func (wc *WC) Err() error {
	if wc.Status == StatusSuccess {
		return nil
	}
	msg := fmt.Sprintf("verbs: WR %d on QP %d: %v", wc.ID, wc.QPN, wc.Status)
	if wc.Reason != ReasonNone {
		msg += " (" + wc.Reason.String() + ")"
	}
	if wc.VendorErr != 0 {
		msg += fmt.Sprintf(" [vendor error %#x]", wc.VendorErr)
	}
	return errors.New(msg)
}

// QPCaps bound a QP's queues.
type QPCaps struct {
	MaxSendWR   int // send queue depth
	MaxRecvWR   int // receive queue depth (RC without SRQ)
	MaxInline   int // largest Inline payload
	MaxRdAtomic int // READs and atomics in flight (ORD)
}

// QPConfig describes a QP to create.
type QPConfig struct {
	Type   QPType
	SendCQ CQ
	RecvCQ CQ
	SRQ    SRQ // required for DCT, optional for RC
	Caps   QPCaps
	// DCKey is the key a DCT checks on every request.
	DCKey uint64
}

// AttrMask selects QPAttr fields that Modify applies even when they are
// zero; other fields are applied only when non-zero.
type AttrMask uint8

const (
	AttrRetryCnt AttrMask = 1 << iota // set RetryCnt, even to 0
	AttrRNRRetry                      // set RNRRetry, even to 0
)

// QPAttr holds the attributes QP.Modify sets.
type QPAttr struct {
	State QPState
	Mask  AttrMask
	// Access is what remote peers may do through this QP (RC and DCT).
	Access Access
	// Path MTU in bytes of payload per packet.
	PathMTU int
	// Remote end of an RC QP.
	RemoteAddr netip.AddrPort
	RemoteQPN  uint32
	// RQPSN is the first PSN expected from the peer (RTR); SQPSN is the
	// first PSN this QP sends (RTS). 24 bits.
	RQPSN uint32
	SQPSN uint32
	// Timeout is the local ACK timeout; RetryCnt and RNRRetry bound
	// retransmissions (7 for RNRRetry means infinite, as in IB).
	Timeout  time.Duration
	RetryCnt int
	RNRRetry int
	// MinRNRTimer is the delay a responder asks for in an RNR NAK.
	MinRNRTimer time.Duration
}

// QPInfo is a snapshot of a QP for listings.
type QPInfo struct {
	QPN       uint32
	Type      QPType
	State     QPState
	Remote    netip.AddrPort
	RemoteQPN uint32
	SQPSN     uint32 // next PSN to send
	RQPSN     uint32 // next PSN expected
	Outstand  int    // WRs posted and not completed
	Stats     QPStats
}

// QPStats are per-QP counters.
type QPStats struct {
	TxPackets, RxPackets uint64
	TxBytes, RxBytes     uint64
	Retransmits          uint64 // packets sent again
	Timeouts             uint64 // retransmission timer expiries
	NAKSeqSent, NAKSeqRx uint64 // PSN sequence NAKs sent and received
	RNRNAKSent, RNRNAKRx uint64
	ErrNAKSent, ErrNAKRx uint64 // access / invalid request NAKs
	Duplicates           uint64 // duplicate requests answered from state
	DCKeyRejects         uint64 // requests refused for a wrong DC key (DCT)
	Errors               uint64 // transitions to ERR
	Completions          uint64
}

// DeviceStats are per-device counters.
type DeviceStats struct {
	TxPackets, RxPackets uint64
	TxBytes, RxBytes     uint64
	TxSyscalls           uint64
	RxSyscalls           uint64
	TxErrors             uint64 // packets the network refused or dropped on send (e.g. larger than the path MTU); the protocols retransmit them
	TxDropped            uint64 // of TxErrors, packets dropped for want of room in the network's queue
	RxErrors             uint64 // receive calls that failed (not packets: see Malformed and NoQP for those)
	Malformed            uint64 // packets that failed to parse
	BadVersion           uint64 // packets of another wire-format version (also in Malformed)
	NoQP                 uint64 // packets for an unknown QPN
	DCKeyRejects         uint64
	Retransmits          uint64
	Misplaced            uint64 // payload copies the NIC made because a segment landed where steering or prediction did not expect (a mispredicted one may be copied twice)
	WriteCopied          uint64 // WRITE payload bytes a software NIC copied into their target after checking the packet's header (it cannot see a header before the kernel places the bytes); 0 on hardware
	BadMAC               uint64 // packets dropped for a missing or wrong cluster-key MAC
	QPs, MRs             int
	MRBytes              uint64
}

// MR is a registered memory region.
type MR interface {
	// Buf is the registered memory. It belongs to the caller; the NIC reads
	// and writes it while the MR is registered.
	Buf() []byte
	// IOVA is the address remote peers name Buf()[0] by: a remote WR
	// reaches Buf()[i] at RemoteAddr IOVA()+i. It is Buf's offset in its
	// page (PageOffset): 0 for a page-aligned buffer (see the package doc).
	IOVA() uint64
	LKey() uint32
	RKey() uint32
	Access() Access
	PD() PD
	// Dereg unregisters the region. Later accesses with its keys fail.
	Dereg() error
}

// PD is a protection domain: MRs are usable only by QPs of the same PD.
type PD interface {
	// RegMR registers buf at IOVA PageOffset(buf) (see MR.IOVA).
	RegMR(buf []byte, access Access) (MR, error)
	CreateQP(cfg QPConfig) (QP, error)
	CreateSRQ(depth int) (SRQ, error)
	Device() Device
}

// CQ is a completion queue.
type CQ interface {
	// Poll moves up to len(wcs) completions into wcs and returns how many.
	Poll(wcs []WC) int
	// Wait blocks until at least one completion is available (then returns
	// nil) or ctx ends. It does not spin.
	Wait(ctx context.Context) error
	// Notify returns a channel that receives a value when completions are
	// added; it has capacity 1 and is never closed.
	Notify() <-chan struct{}
	Destroy() error
}

// DrivenCQ is a CQ whose device can run its receive path on the waiting
// goroutine: run-to-completion for synchronous operations. A caller that
// posts a WR and waits for its completion with Drive may become the
// device's receiver: it blocks in the device's receive call itself, handles
// every packet it receives (for every QP and CQ of the device, not only its
// own) and returns as soon as its own condition holds, instead of sleeping
// until another thread receives the response and wakes it. That saves the
// two thread wake-ups of a hand-off, which cost more than the network round
// trip on a small machine.
//
// The device keeps one receive token: at most one goroutine receives at a
// time (a caller of Drive, or the device's own receive goroutine when
// nobody drives), and whoever holds it delivers everything it receives.
// Callers that do not hold it sleep until their condition may have become
// true or the token is handed to them.
//
// Contract:
//   - ready is called on the caller's goroutine, before blocking and after
//     every received packet batch and every wake-up; it may poll this CQ and
//     act on the completions (post more WRs, finish other callers'
//     operations), and reports whether the caller is done. It must not
//     block and must not call Drive.
//   - wake, if not nil, is a channel on which another goroutine sends after
//     making this caller's ready true; Drive may consume the value.
//   - Whoever makes some caller's ready true from another goroutine (for
//     example by finishing its operation after polling the CQ) calls Wake
//     afterwards, so that a caller blocked receiving looks again. Wake costs
//     two atomic operations when nobody drives and a datagram to the device
//     itself when a caller is blocked receiving.
//   - While a Drive runs, completions added to the CQ do not signal Notify:
//     the drivers' ready polls them. When the last Drive returns with
//     completions left, Notify is signalled. A dispatcher waiting on Notify
//     therefore does not compete with synchronous callers.
//   - Drive returns nil once ready reported true, ctx.Err() when ctx ends
//     first, and ErrClosed or ErrDestroyed when the device closes or the CQ
//     is destroyed.
type DrivenCQ interface {
	CQ
	Drive(ctx context.Context, wake <-chan struct{}, ready func() bool) error
	Wake()
	// Pending reports whether completions wait to be polled, without a
	// lock: a ready function skips its Poll when nothing is there (a
	// completion pushed after the answer calls Wake, as above).
	Pending() bool
}

// SRQ is a shared receive queue.
type SRQ interface {
	PostRecv(wrs []RecvWR) error
	// Posted is the number of receive WRs waiting for messages.
	Posted() int
	// ArmLimit arms the SRQ's limit (ibv_modify_srq, IBV_SRQ_LIMIT): once
	// fewer than limit receives are posted, the device raises one
	// EventSRQLimit for this SRQ and disarms it. 0 disarms.
	ArmLimit(limit int) error
	Destroy() error
}

// QP is a queue pair.
type QP interface {
	// QPN is the QP's number. A DCT has none before it reaches RTR (mlx5
	// assigns it in the INIT->RTR transition): 0 until then.
	QPN() uint32
	Type() QPType
	State() QPState
	// Modify moves the QP to attr.State, applying the attributes the
	// transition needs (see package doc).
	Modify(attr QPAttr) error
	// PostSend posts a batch of WRs with one doorbell.
	PostSend(wrs []SendWR) error
	// PostRecv posts receive WRs (RC without SRQ).
	PostRecv(wrs []RecvWR) error
	// SendQueueFree is how many more send WRs can be posted now.
	SendQueueFree() int
	Info() QPInfo
	Destroy() error
}

// AtomicCap is what a device's atomic operations guarantee
// (ibv_device_attr.atomic_cap).
type AtomicCap uint8

const (
	// AtomicNone: no atomics. PostSend refuses CMP_SWAP and FETCH_ADD
	// (ErrNotSupported), and Modify to INIT refuses an RC QP or a DCT
	// asking for AccessRemoteAtomic (ErrNotSupported). Upstream mlx5
	// reports it unless the firmware answers atomics in host byte order.
	AtomicNone AtomicCap = iota
	// AtomicHCA: atomics are atomic among the NIC's own operations only,
	// not with the CPU's accesses to the same word (IBV_ATOMIC_HCA): a
	// word remote atomics update must not be updated by local code too.
	AtomicHCA
	// AtomicGlob: atomics are also atomic with the CPU's atomic
	// instructions on the same word (IBV_ATOMIC_GLOB).
	AtomicGlob
)

func (a AtomicCap) String() string {
	switch a {
	case AtomicNone:
		return "none"
	case AtomicHCA:
		return "HCA"
	case AtomicGlob:
		return "global"
	}
	return fmt.Sprintf("AtomicCap(%d)", uint8(a))
}

// DeviceAttr is what a device supports.
type DeviceAttr struct {
	Atomic   AtomicCap
	MaxSRQWR int // the deepest SRQ (CreateSRQ)
	MaxCQE   int // the deepest CQ (CreateCQ)
	MaxQPWR  int // the deepest send or receive queue of a QP
}

// EventType is the kind of an asynchronous event (enum ibv_event_type).
type EventType uint8

const (
	// EventQPFatal: the QP moved to ERR for a reason no completion
	// reports (IBV_EVENT_QP_FATAL).
	EventQPFatal EventType = iota + 1
	// EventQPReqErr: the QP, as a responder, received a request it cannot
	// execute (invalid opcode or length, misaligned atomic) and moved to
	// ERR (IBV_EVENT_QP_REQ_ERR).
	EventQPReqErr
	// EventQPAccessErr: the QP, as a responder, refused a remote access
	// (bad rkey, out of bounds, missing permission) and moved to ERR
	// (IBV_EVENT_QP_ACCESS_ERR).
	EventQPAccessErr
	// EventQPLastWQE: a QP attached to an SRQ moved to ERR and takes no
	// more receives from it (IBV_EVENT_QP_LAST_WQE_REACHED).
	EventQPLastWQE
	// EventCQErr: the CQ overran; completions were lost and the QPs that
	// complete into it cannot be trusted (IBV_EVENT_CQ_ERR).
	EventCQErr
	// EventSRQLimit: fewer receives are posted than the limit armed with
	// SRQ.ArmLimit (IBV_EVENT_SRQ_LIMIT_REACHED).
	EventSRQLimit
	// EventSRQErr: the SRQ failed; its QPs take no more receives from it
	// (IBV_EVENT_SRQ_ERR).
	EventSRQErr
	// EventPortActive and EventPortErr: the port came up or went down
	// (IBV_EVENT_PORT_ACTIVE, IBV_EVENT_PORT_ERR).
	EventPortActive
	EventPortErr
	// EventDeviceFatal: the device is unusable (IBV_EVENT_DEVICE_FATAL).
	EventDeviceFatal
)

func (t EventType) String() string {
	switch t {
	case EventQPFatal:
		return "QP fatal"
	case EventQPReqErr:
		return "QP invalid request"
	case EventQPAccessErr:
		return "QP access error"
	case EventQPLastWQE:
		return "QP last WQE reached"
	case EventCQErr:
		return "CQ error"
	case EventSRQLimit:
		return "SRQ limit reached"
	case EventSRQErr:
		return "SRQ error"
	case EventPortActive:
		return "port active"
	case EventPortErr:
		return "port down"
	case EventDeviceFatal:
		return "device fatal"
	}
	return fmt.Sprintf("EventType(%d)", uint8(t))
}

// IsQPError reports whether t says that a QP moved to ERR.
func (t EventType) IsQPError() bool {
	return t == EventQPFatal || t == EventQPReqErr || t == EventQPAccessErr || t == EventQPLastWQE
}

// Event is an asynchronous event: something the device reports outside
// completions (ibv_get_async_event). Exactly the field its Type names is
// set.
type Event struct {
	Type EventType
	QP   QP  // QP events
	CQ   CQ  // EventCQErr
	SRQ  SRQ // EventSRQLimit, EventSRQErr
	Port int // port events
}

func (ev Event) String() string {
	switch {
	case ev.QP != nil:
		return fmt.Sprintf("%v on %v QP %d", ev.Type, ev.QP.Type(), ev.QP.QPN())
	case ev.Port != 0:
		return fmt.Sprintf("%v (port %d)", ev.Type, ev.Port)
	}
	return ev.Type.String()
}

// ConnRequest is what a passive RC side learns of an incoming connection.
type ConnRequest struct {
	RemoteAddr netip.AddrPort
	RemoteQPN  uint32
	Private    []byte
}

// AcceptFunc decides on a connection request: it returns a QP in RESET (or
// an error to reject) and private data for the reply. The connection
// manager moves the QP through INIT, RTR and RTS.
type AcceptFunc func(req ConnRequest) (qp QP, private []byte, err error)

// ConnParams tune a connection made by the connection manager.
type ConnParams struct {
	Access   Access
	PathMTU  int
	Timeout  time.Duration
	RetryCnt int
	RNRRetry int
	// Private is carried to the passive side in the request.
	Private []byte
}

// Device is an RDMA device (an RNIC port).
type Device interface {
	// Addr is the device's network address: the GID analogue other
	// devices send to.
	Addr() netip.AddrPort
	AllocPD() (PD, error)
	CreateCQ(depth int) (CQ, error)
	// ListenRC registers a connection-manager service on this device.
	ListenRC(service uint32, accept AcceptFunc) error
	// StopListenRC removes a service registered with ListenRC.
	StopListenRC(service uint32) error
	// ConnectRC brings qp (in RESET) up to RTS connected to the peer's
	// service, with a request/reply/ready handshake. It returns the
	// passive side's private data.
	ConnectRC(ctx context.Context, qp QP, remote netip.AddrPort, service uint32, p ConnParams) ([]byte, error)
	// MaxMTU is the largest path MTU the device supports.
	MaxMTU() int
	// Attr is what the device supports (ibv_query_device).
	Attr() DeviceAttr
	// OnEvent subscribes fn to the device's asynchronous events (see
	// Event). Every subscriber sees every event, in the order the device
	// raised them, on a goroutine of the device's: fn must not block for
	// long; it may call verbs methods (Destroy the QP an event names, for
	// example). cancel unsubscribes; fn is not called after it returned.
	OnEvent(fn func(Event)) (cancel func())
	Stats() DeviceStats
	QPs() []QPInfo
	Close() error
}

// serviceNames maps connection-manager service numbers to what they are,
// for error messages (RegisterServiceName).
var serviceNames sync.Map // uint32 -> string

// RegisterServiceName names a connection-manager service number in error
// messages ("the krfs meta service" rather than a bare number). Packages
// that listen on a fixed service call it from init.
func RegisterServiceName(service uint32, name string) { serviceNames.Store(service, name) }

// ServiceName is how error messages name a connection-manager service:
// its registered name, or its number in hex.
func ServiceName(service uint32) string {
	if v, ok := serviceNames.Load(service); ok {
		return v.(string)
	}
	return fmt.Sprintf("CM service %#x", service)
}
