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
//     on InfiniBand, GID 0 and the port's LID).
//   - PD, CQ, SRQ: ibv_alloc_pd, ibv_create_cq with a completion channel
//     (a goroutine polls its file descriptor and feeds CQ.Notify; Poll and
//     Wait read the CQ), ibv_create_srq.
//   - MR: ibv_reg_mr_iova with iova 0 over pinned Go memory
//     (runtime.Pinner), so that local SGE addresses and remote addresses
//     are offsets in the MR: the zero-based MRs verbs promises. A device
//     whose kernel driver cannot register at iova 0 is refused at Open
//     with a message (no silent translation); `krfs devices` shows it.
//   - RC QP: ibv_create_qp and ibv_post_send, WRs chained 32 to a
//     doorbell.
//   - DCI and DCT: mlx5dv_create_qp with MLX5DV_QP_INIT_ATTR_MASK_DC; a
//     DCI posts with the extended API (ibv_wr_start, ibv_wr_*,
//     mlx5dv_wr_set_dc_addr with an address handle per target,
//     ibv_wr_complete). A device without DC (rxe, siw, non-mlx5 RNICs)
//     reports it (DeviceInfo.DC, Caps.DC, with the reason) and CreateQP
//     of a DCI or DCT fails: qpcore must then run RC-only.
//   - Address handles: from the peer's GID (RoCE, is_global) or LID
//     (InfiniBand), learned through the connection manager.
//
// The ibverbs ABI values the translation uses are mirrored as Go
// constants (translate.go) so that WR, WC, status, access and address
// translation is unit-tested in CI without a device; abi_rdma.go checks
// every one against the header at compile time.
//
// # Addresses and the connection manager
//
// A verbs address (Device.Addr, DCTarget.Addr, QPAttr.RemoteAddr) is the
// UDP address of the device's connection manager, which runs out of band
// over UDP (cm.go): REQ/REP/RTU exchange QPNs, start PSNs, MTUs, GIDs and
// LIDs; ADDR_QUERY resolves an address to its GID and LID for DC targets
// and hand-connected RC QPs (one round trip on first use, then cached).
// By default the CM binds the GID's IP (RoCE), so the address meta
// publishes is the RoCE interface's.
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
