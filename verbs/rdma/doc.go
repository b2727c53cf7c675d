// Package rdma is a verbs backend over RDMA hardware: libibverbs from
// rdma-core (RC on any RNIC) and mlx5 direct verbs (DC on ConnectX). It
// is compiled only with the build tag rdma (and cgo on Linux); without
// the tag, Devices and Open fail with ErrNotBuilt and the default build
// stays pure Go.
//
//	go build -tags rdma ./cmd/krfs     # needs libibverbs-dev (rdma-core >= 44)
//
// STATUS: this backend has been compiled, vetted and unit-tested without a
// device; it has never run on an RNIC. See docs/hardware.md for what ran
// where and how to run the conformance suite on hardware.
//
// # Mapping to ibverbs
//
//   - Device: one port of an RNIC (ibv_open_device, ibv_query_port), with
//     one GID (Config.GIDIndex; by default the port's RoCEv2 IPv4 GID or,
//     on InfiniBand, GID 0 and the port's LID). Attr comes from
//     ibv_query_device (atomic_cap, max_srq_wr, max_cqe, max_qp_wr).
//     Config.QoS sets the traffic class, service level and hop limit of
//     every address vector.
//   - PD, SRQ: ibv_alloc_pd, ibv_create_srq (no deeper than max_srq_wr;
//     ArmLimit is ibv_modify_srq with IBV_SRQ_LIMIT).
//   - CQ: two NIC CQs, one for send and one for receive completions, on
//     one completion channel (a goroutine polls its file descriptor and
//     feeds Notify; Poll and Wait read both). An error completion carries
//     no opcode (mlx5 writes only wr_id, status, qp_num and vendor_err on
//     its error path), so the half it came from says whether it completes
//     a send or a receive.
//   - MR: ibv_reg_mr_iova over pinned Go memory (runtime.Pinner) at the
//     buffer's page offset, the only IOVA the kernel accepts for it (see
//     verbs.MR.IOVA): SGE offsets become IOVA + offset. Open probes that
//     registration (a page at IOVA 0, a buffer 80 bytes into a page at
//     IOVA 80) and refuses a device that cannot; `krfs devices` shows it.
//   - RC QP: ibv_create_qp and ibv_post_send, WRs chained 32 to a
//     doorbell.
//   - DCI and DCT: mlx5dv_create_qp with MLX5DV_QP_INIT_ATTR_MASK_DC; a
//     DCI posts with the extended API (ibv_wr_start, ibv_wr_*,
//     mlx5dv_wr_set_dc_addr with an address handle per target,
//     ibv_wr_complete) and asks for the atomic operations only on a
//     device with atomics. A DCT gets its number at INIT->RTR (rdma-core
//     fills qp_num from the kernel's answer): QPN is 0 before, and the QP
//     is found by number only from then on. A device without DC (rxe,
//     ConnectX-4 Lx, non-mlx5 RNICs) reports it (DeviceInfo.DC, Caps.DC,
//     with the reason) and CreateQP of a DCI or DCT fails: qpcore must
//     then run RC-only.
//   - Transitions are checked before ibv_modify_qp (verbs.ValidTransition
//     per QP type, retry counts, path MTU, remote atomic access on a
//     device without atomics), so the kernel never sees an invalid one.
//   - Address handles: from the peer's GID (RoCE, is_global) or LID
//     (InfiniBand), learned through the connection manager; a DCI WR that
//     ends in a retry error drops its target's handle and CM answer, so
//     the next WR resolves it again.
//   - Async events: a goroutine reads ibv_get_async_event (the context's
//     async fd, non-blocking), acknowledges each at once, moves a QP an
//     error event names to ERR, and hands Device.OnEvent subscribers the
//     event with this device's QP, CQ or SRQ.
//
// The ibverbs ABI values the translation uses are mirrored as Go
// constants (translate.go) so that WR, WC, status, access and address
// translation is unit-tested in CI without a device; abi_rdma.go checks
// every one against the header at compile time. The rules the backend
// applies before calling the kernel are pure functions (hwrules.go),
// tested the same way.
//
// # Addresses and the connection manager
//
// A verbs address (Device.Addr, DCTarget.Addr, QPAttr.RemoteAddr) is the
// UDP address of the device's connection manager, which runs out of band
// over UDP (cm.go): REQ/REP/RTU exchange QPNs, start PSNs, MTUs, GIDs and
// LIDs; ADDR_QUERY resolves an address to its GID and LID for DC targets
// and hand-connected RC QPs (one round trip on first use, then cached).
// By default the CM binds the GID's IP (RoCE) at DefaultCMPort (4792), so
// the address meta publishes is the RoCE interface's and other nodes can
// name a node by its IP alone; UDP port 4791 is refused (RoCEv2's: the
// NIC takes every datagram to it).
//
// # Where hardware differs from softnic
//
//   - Reasons: ibv_wc carries no reason. A remote access error has
//     ReasonNone, not RKey/Bounds/Perm; retry exhaustion has
//     ReasonRemoteDown. An mlx5 DCT drops requests with a wrong DC key, so
//     a stale key shows as RETRY_EXC_ERR after the DCI's retries, not as
//     REM_INV_REQ_ERR with ReasonDCKey; qpcore then treats the peer as
//     unreachable and meta's lookup refreshes it.
//   - WC.SrcAddr of a DCT receive is zero (the NIC reports only the
//     DCI's QPN).
//   - RTS->RTS cannot change the ACK timeout or retry counts (IBA);
//     Modify refuses it instead of ignoring it.
//   - Local pre-checks (keys, bounds, access, queue room) are done in Go
//     before posting, exactly as verbs promises; the NIC's own checks
//     stay as a second line.
package rdma
