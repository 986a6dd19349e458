package segments

import (
	"context"
	"fmt"

	"github.com/stockctl/stockctl/internal/lock"
)

// runStep runs req's business step, if it has one, while holds are held
// (its ctx is cancelled if one of them is lost), and hands parts to the
// committer. It is the one way an order's step is run: in a held segment's
// slot (slots.go, through stepInSlot) and in places locked by a fallback
// (gather.go). It returns the commit request to wait on, or, when the step
// failed or a lock was lost during it, the failure, with parts given back
// (nothing deducted).
//
// A step that panics gets the same clean-up as one that fails (parts given
// back, its ctx released), and the panic then goes on to AllocateFunc's
// caller; the callers unlock the holds with defer.
func (e *Engine) runStep(ctx context.Context, req *allocReq, holds []*lock.Hold, parts []commitPart) (*commitReq, placeResult) {
	if req.step != nil {
		err := callStep(ctx, req.step, holds, parts)
		for _, h := range holds {
			if cause := context.Cause(h.Ctx()); cause != nil {
				cancelParts(parts)
				what := "the step itself succeeded"
				if err != nil {
					what = fmt.Sprintf("the step itself returned: %v", err)
				}
				return nil, failed(fmt.Errorf("%w during the business step (%s); nothing was deducted", cause, what))
			}
		}
		if err != nil {
			cancelParts(parts)
			return nil, failed(fmt.Errorf("business step: %w", err))
		}
	}
	return e.held.submit(ctx, req, parts), placeResult{}
}

// callStep runs step with a ctx bound to holds. If step does not return
// (it panics, or calls runtime.Goexit), parts are given back before the
// panic goes on: a recovered panic must not leave their units reserved,
// nor the segment pinned, for the rest of the process's life.
func callStep(ctx context.Context, step Step, holds []*lock.Hold, parts []commitPart) error {
	sctx, unbind := bindAll(ctx, holds)
	defer unbind()
	returned := false
	defer func() {
		if !returned {
			cancelParts(parts)
		}
	}()
	err := step(sctx)
	returned = true
	return err
}

// stepInSlot runs req's step in a held segment's slot (h, with part
// reserved there) and hands the part to the committer: the slot is free
// again as soon as the step returns, or panics.
func (e *Engine) stepInSlot(ctx context.Context, req *allocReq, h *lock.Hold, part commitPart) (*commitReq, placeResult) {
	defer func() { _ = h.Unlock(e.bg.Ctx()) }()
	return e.runStep(ctx, req, []*lock.Hold{h}, []commitPart{part})
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
