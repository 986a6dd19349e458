package segments

import (
	"context"
	"time"

	"github.com/stockctl/stockctl/internal/lock"
)

// Rungs 6 and 7 of the ladder: a place that holds the quantity alone, under
// its own lock, and a gather from several places at once.

// tryPlace tries to serve req from one place, waiting up to wait for its
// lock, a wait that waitCtx (ctx or a child of it) may also end.
func (e *Engine) tryPlace(ctx, waitCtx context.Context, req *allocReq, p Place, wait time.Duration) placeResult {
	hp, err := e.lockPlace(waitCtx, req.sku.name, p, wait)
	if err != nil {
		return lockFailure(err)
	}
	return e.commitHeld(ctx, []*heldPlace{hp}, req)
}

// gather serves req from several places at once: it locks places that had
// stock in snap in the global order (pool, then segments by index), so two
// gatherers can never wait for each other in a cycle, until the locked
// places hold qty together, and takes from them in one transaction. A place
// found empty is released at once: a gatherer only ever waits while holding
// places that contribute, and only lower ones. Each lock is waited for at
// most FallbackWait: a gather that cannot get one lets go of all (resBusy)
// and the order looks again. waitCtx (ctx or a child of it) may end the lock
// waits sooner.
func (e *Engine) gather(ctx, waitCtx context.Context, req *allocReq, snap *snapshot) placeResult {
	var held []*heldPlace
	defer func() {
		for _, hp := range held {
			hp.unlock()
		}
	}()
	var sum int64
	for _, p := range snap.withStock() {
		hp, err := e.lockPlace(waitCtx, req.sku.name, p, e.cfg.FallbackWait)
		if err != nil {
			return lockFailure(err)
		}
		if err := hp.load(ctx, true); err != nil {
			hp.unlock()
			return failed(err)
		}
		if hp.available() <= 0 {
			// Sold out since the snapshot: let it go now rather than
			// hold an empty place while waiting for the next one (which
			// would queue every other gatherer behind us).
			hp.unlock()
			continue
		}
		held = append(held, hp)
		if sum += hp.available(); sum >= req.qty {
			hs := held
			held = nil // commitHeld unlocks them
			return e.commitHeld(ctx, hs, req)
		}
	}
	return placeResult{kind: resShort}
}

// commitHeld serves req from the held places (one for a fallback place,
// several for a gather): it reserves the quantity over them in order,
// reading a segment's inbox only when its counter falls short, runs req's
// step while the places are held, and commits through the committer. The
// places are unlocked once the commit is answered: a fallback place's key
// is not retained, so it must outlive the commit it fences.
func (e *Engine) commitHeld(ctx context.Context, held []*heldPlace, req *allocReq) placeResult {
	defer func() {
		for _, hp := range held {
			hp.unlock()
		}
	}()
	var parts []commitPart
	left := req.qty
	for _, hp := range held {
		if left == 0 {
			break
		}
		if err := hp.load(ctx, false); err != nil {
			cancelParts(parts)
			return failed(err)
		}
		if hp.available() < left && hp.st.inKey != "" {
			if err := hp.load(ctx, true); err != nil {
				cancelParts(parts)
				return failed(err)
			}
		}
		take := min(left, hp.available())
		if take <= 0 {
			continue
		}
		part, ok := reservePart(hp.h.Queue(), hp.h.Own(), hp.st, take)
		if !ok {
			continue
		}
		parts = append(parts, part)
		left -= take
	}
	if left > 0 {
		cancelParts(parts)
		return placeResult{kind: resShort}
	}
	holds := make([]*lock.Hold, len(held))
	for i, hp := range held {
		holds[i] = hp.h
	}
	cr, r := e.runStep(ctx, req, holds, parts)
	if cr == nil {
		return r
	}
	return cr.wait(ctx)
}
