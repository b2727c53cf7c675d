package meta

// splitGroup cuts a write batch into groups of at most n WRITEs, so that
// no group is larger than the loopback send queue (loopDepth): flush posts
// a group only when the queue has room for all of it, and a group larger
// than the queue would wait forever, with every reply queued behind it (a
// sweep that expired 1,024 or more leases at once built one group of
// about four WRITEs per lease and locked the service up).
//
// Any cut is safe. The groups are posted in order on one RC QP, which
// executes and completes them in order, so the WRITEs land as they would
// as one group; a reader meanwhile sees what it could see between any two
// WRITEs (a slot's odd head, an odd membership generation) and reads
// again. The last group carries the batch's replies, which leave only
// once every WRITE before them is done, and its slots, which a repair of
// the loopback QP rewrites: a group still in flight or waiting when the
// pair fails means the last group is too, so every slot the batch touched
// is rewritten.
func splitGroup(wb writeBatch, n int) []writeBatch {
	if len(wb.wrs) <= n {
		return []writeBatch{wb}
	}
	out := make([]writeBatch, 0, (len(wb.wrs)+n-1)/n)
	for len(wb.wrs) > n {
		out = append(out, writeBatch{wrs: wb.wrs[:n:n]})
		wb.wrs = wb.wrs[n:]
	}
	return append(out, wb)
}
