package meta

import "fmt"

// Every test checks the server's count of pending table WRITEs against
// the write groups it stands for, at every flush.
func init() {
	checkPending = func(s *Server) {
		n := 0
		for i := range s.backlog {
			n += len(s.backlog[i].wrs)
		}
		for _, g := range s.inflight {
			n += len(g.wrs)
		}
		if n != s.queued {
			panic(fmt.Sprintf("meta: %d table WRITEs counted pending, %d in the groups", s.queued, n))
		}
	}
}
