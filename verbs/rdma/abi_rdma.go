//go:build rdma && linux && cgo

package rdma

/*
#include <infiniband/verbs.h>
*/
import "C"

// Compile-time checks that the ABI values translate.go mirrors match the
// header this build compiles against: indexing a one-element array with
// a constant other than 0 does not compile.
var _ = [...]struct{}{
	[1]struct{}{}[ibvWCSuccess-C.IBV_WC_SUCCESS],
	[1]struct{}{}[ibvWCLocLenErr-C.IBV_WC_LOC_LEN_ERR],
	[1]struct{}{}[ibvWCLocQPOpErr-C.IBV_WC_LOC_QP_OP_ERR],
	[1]struct{}{}[ibvWCLocProtErr-C.IBV_WC_LOC_PROT_ERR],
	[1]struct{}{}[ibvWCWRFlushErr-C.IBV_WC_WR_FLUSH_ERR],
	[1]struct{}{}[ibvWCBadRespErr-C.IBV_WC_BAD_RESP_ERR],
	[1]struct{}{}[ibvWCLocAccessErr-C.IBV_WC_LOC_ACCESS_ERR],
	[1]struct{}{}[ibvWCRemInvReqErr-C.IBV_WC_REM_INV_REQ_ERR],
	[1]struct{}{}[ibvWCRemAccessErr-C.IBV_WC_REM_ACCESS_ERR],
	[1]struct{}{}[ibvWCRemOpErr-C.IBV_WC_REM_OP_ERR],
	[1]struct{}{}[ibvWCRetryExcErr-C.IBV_WC_RETRY_EXC_ERR],
	[1]struct{}{}[ibvWCRNRRetryExc-C.IBV_WC_RNR_RETRY_EXC_ERR],
	[1]struct{}{}[ibvWCRemAbortErr-C.IBV_WC_REM_ABORT_ERR],
	[1]struct{}{}[ibvWCFatalErr-C.IBV_WC_FATAL_ERR],
	[1]struct{}{}[ibvWCRespTimeout-C.IBV_WC_RESP_TIMEOUT_ERR],
	[1]struct{}{}[ibvWCGeneralErr-C.IBV_WC_GENERAL_ERR],
	[1]struct{}{}[ibvWCRemInvRdReqEr-C.IBV_WC_REM_INV_RD_REQ_ERR],
	[1]struct{}{}[ibvWCSend-C.IBV_WC_SEND],
	[1]struct{}{}[ibvWCRDMAWrite-C.IBV_WC_RDMA_WRITE],
	[1]struct{}{}[ibvWCRDMARead-C.IBV_WC_RDMA_READ],
	[1]struct{}{}[ibvWCCompSwap-C.IBV_WC_COMP_SWAP],
	[1]struct{}{}[ibvWCFetchAdd-C.IBV_WC_FETCH_ADD],
	[1]struct{}{}[ibvWCRecv-C.IBV_WC_RECV],
	[1]struct{}{}[ibvWCRecvRDMAWithIm-C.IBV_WC_RECV_RDMA_WITH_IMM],
	[1]struct{}{}[ibvWCWithImm-C.IBV_WC_WITH_IMM],
	[1]struct{}{}[ibvWRRDMAWrite-C.IBV_WR_RDMA_WRITE],
	[1]struct{}{}[ibvWRRDMAWriteWithImm-C.IBV_WR_RDMA_WRITE_WITH_IMM],
	[1]struct{}{}[ibvWRSend-C.IBV_WR_SEND],
	[1]struct{}{}[ibvWRSendWithImm-C.IBV_WR_SEND_WITH_IMM],
	[1]struct{}{}[ibvWRRDMARead-C.IBV_WR_RDMA_READ],
	[1]struct{}{}[ibvWRAtomicCmpAndSwp-C.IBV_WR_ATOMIC_CMP_AND_SWP],
	[1]struct{}{}[ibvWRAtomicFetchAdd-C.IBV_WR_ATOMIC_FETCH_AND_ADD],
	[1]struct{}{}[ibvSendFence-C.IBV_SEND_FENCE],
	[1]struct{}{}[ibvSendSignaled-C.IBV_SEND_SIGNALED],
	[1]struct{}{}[ibvSendSolicited-C.IBV_SEND_SOLICITED],
	[1]struct{}{}[ibvSendInline-C.IBV_SEND_INLINE],
	[1]struct{}{}[ibvAccessLocalWrite-C.IBV_ACCESS_LOCAL_WRITE],
	[1]struct{}{}[ibvAccessRemoteWrite-C.IBV_ACCESS_REMOTE_WRITE],
	[1]struct{}{}[ibvAccessRemoteRead-C.IBV_ACCESS_REMOTE_READ],
	[1]struct{}{}[ibvAccessRemoteAtomic-C.IBV_ACCESS_REMOTE_ATOMIC],
	[1]struct{}{}[ibvAccessZeroBased-C.IBV_ACCESS_ZERO_BASED],
	[1]struct{}{}[ibvQPSReset-C.IBV_QPS_RESET],
	[1]struct{}{}[ibvQPSInit-C.IBV_QPS_INIT],
	[1]struct{}{}[ibvQPSRTR-C.IBV_QPS_RTR],
	[1]struct{}{}[ibvQPSRTS-C.IBV_QPS_RTS],
	[1]struct{}{}[ibvQPSErr-C.IBV_QPS_ERR],
	[1]struct{}{}[ibvMTU256-C.IBV_MTU_256],
	[1]struct{}{}[ibvMTU4096-C.IBV_MTU_4096],
	[1]struct{}{}[ibvPortActive-C.IBV_PORT_ACTIVE],
	[1]struct{}{}[ibvLinkLayerInfiniBand-C.IBV_LINK_LAYER_INFINIBAND],
	[1]struct{}{}[ibvLinkLayerEthernet-C.IBV_LINK_LAYER_ETHERNET],
	[1]struct{}{}[ibvGIDTypeIB-C.IBV_GID_TYPE_IB],
	[1]struct{}{}[ibvGIDTypeRoCEv1-C.IBV_GID_TYPE_ROCE_V1],
	[1]struct{}{}[ibvGIDTypeRoCEv2-C.IBV_GID_TYPE_ROCE_V2],
}
