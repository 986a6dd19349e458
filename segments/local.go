package segments

import "context"

// serve sells req from the segments this process holds or can take: rungs
// 1 to 4 of the ladder (ladder.go). It returns resShort when it found no
// stock it can reach (the order goes on to the whole SKU), and otherwise
// the order's outcome.
func (s *seller) serve(ctx context.Context, req *allocReq, home int) placeResult {
	select {
	case <-s.viewed:
	case <-ctx.Done():
		return failed(context.Cause(ctx))
	}
	if req.step == nil {
		return s.servePlain(ctx, req, home)
	}
	return s.serveStep(ctx, req, home)
}

// servePlain sells an order without a step: it needs no slot, only units
// reserved on a held segment (home first, else the one with the most).
func (s *seller) servePlain(ctx context.Context, req *allocReq, home int) placeResult {
	dry := dryRungs{}
	for {
		best, bestAvail := -1, int64(0)
		for _, i := range s.order(home) {
			own, _ := s.qs[i].Tenure()
			if own == nil {
				continue
			}
			if err := s.st(i).ensure(ctx, s.e, own); err != nil {
				return failed(err)
			}
			st := s.st(i)
			st.mu.Lock()
			a := st.availLocked()
			st.mu.Unlock()
			if a < req.qty {
				continue
			}
			if i == home {
				best = i
				break
			}
			if a > bestAvail {
				best, bestAvail = i, a
			}
		}
		if best >= 0 {
			own, _ := s.qs[best].Tenure()
			if own != nil {
				if part, ok := reservePart(s.qs[best], own, s.st(best), req.qty); ok {
					return s.e.held.submit(ctx, req, []commitPart{part}).wait(ctx)
				}
			}
			continue
		}
		if r, ok := s.tryDirect(ctx, req, home); ok && r.kind != resShort {
			return r
		}
		s.climbing.Add(1)
		r, again := dry.climb(ctx, s, req, home)
		s.climbing.Add(-1)
		if !again {
			return r
		}
	}
}
