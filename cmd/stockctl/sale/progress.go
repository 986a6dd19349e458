package sale

import "time"

// Progress is a view of a run in progress.
type Progress struct {
	Elapsed  time.Duration
	Orders   int64 // orders served so far
	Units    int64 // units sold so far
	Refusals int64
	Errors   int64
	// Rate is orders served per second over the last interval.
	Rate float64
	// Buyers still buying.
	Buyers int64
	// Done is set on the last call, when every buyer has stopped.
	Done bool
}

// report calls Progress every interval until done is closed, then once
// more with the final figures.
func (r *run) report(done <-chan struct{}) {
	if r.cfg.Progress == nil {
		<-done
		return
	}
	t := time.NewTicker(r.cfg.ProgressInterval)
	defer t.Stop()
	lastOrders, lastAt := int64(0), r.start
	snap := func(final bool) Progress {
		now := time.Now()
		p := Progress{Elapsed: now.Sub(r.start), Orders: r.orders.Load(), Units: r.units.Load(),
			Refusals: r.refusals.Load(), Errors: r.errs.Load(), Buyers: r.active.Load(), Done: final}
		if dt := now.Sub(lastAt).Seconds(); dt > 0 {
			p.Rate = float64(p.Orders-lastOrders) / dt
		}
		lastOrders, lastAt = p.Orders, now
		return p
	}
	r.cfg.Progress(snap(false))
	for {
		select {
		case <-done:
			r.cfg.Progress(snap(true))
			return
		case <-t.C:
			r.cfg.Progress(snap(false))
		}
	}
}
