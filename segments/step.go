package segments

import (
	"context"
	"fmt"

	"github.com/stockctl/stockctl/internal/lock"
)

// runStep runs req's business step, if it has one, while holds are held
// (its ctx is cancelled if one of them is lost), and hands parts to the
// committer. It is the one way an order's step is run: in a held segment's
// slot (slots.go) and in places locked by a fallback (gather.go). It
// returns the commit request to wait on, or, when the step failed or a
// lock was lost during it, the failure, with parts given back (nothing
// deducted).
func (e *Engine) runStep(ctx context.Context, req *allocReq, holds []*lock.Hold, parts []commitPart) (*commitReq, placeResult) {
	if req.step != nil {
		sctx, unbind := bindAll(ctx, holds)
		err := req.step(sctx)
		unbind()
		for _, h := range holds {
			if cause := context.Cause(h.Ctx()); cause != nil {
				cancelParts(parts)
				return nil, failed(fmt.Errorf("%w during the business step (its result: %v)", cause, err))
			}
		}
		if err != nil {
			cancelParts(parts)
			return nil, failed(fmt.Errorf("business step: %w", err))
		}
	}
	return e.submit(ctx, req, parts), placeResult{}
}

// bindAll returns ctx cancelled when any of holds is lost.
func bindAll(ctx context.Context, holds []*lock.Hold) (context.Context, context.CancelFunc) {
	cancels := make([]context.CancelFunc, 0, len(holds))
	for _, h := range holds {
		var cancel context.CancelFunc
		ctx, cancel = h.Bind(ctx)
		cancels = append(cancels, cancel)
	}
	return ctx, func() {
		for _, cancel := range cancels {
			cancel()
		}
	}
}

// cancelParts gives back parts that will not be committed.
func cancelParts(parts []commitPart) {
	for _, p := range parts {
		p.cancel()
	}
}
