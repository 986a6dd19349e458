package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	ucli "github.com/urfave/cli/v2"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/engines"
)

const (
	// watchRedraw is the shortest time between two frames on a terminal.
	// A hot sale changes a SKU hundreds of times a second; redrawing each
	// change would flood the terminal with frames no one can read, and the
	// writes would hold the watch up.
	watchRedraw = 100 * time.Millisecond
	// watchTick redraws an unchanged terminal frame, so that its clock
	// runs and its rates fall once a sale stops.
	watchTick = time.Second
	// watchRetryMin and watchRetryMax bound the wait between two attempts
	// to read the snapshot again after the watch was lost.
	watchRetryMin = 500 * time.Millisecond
	watchRetryMax = 5 * time.Second
)

// saleWatch follows one SKU for status --watch: a snapshot, then one etcd
// watch of the whole prefix from the snapshot's revision on, each response
// applied whole and shown as a frame.
//
// One watch of the prefix rather than one per key range (stock, orders,
// locks, election): etcd orders events only within one watch. With
// several, a restock's new pool could arrive before its new total, and a
// frame would show books that never were. The price is that events of the
// prefix's other SKUs reach this process too, to be skipped.
type saleWatch struct {
	coord  *coordinator.Coordinator
	client *clientv3.Client
	state  *saleState
	now    func() time.Time
	// loadTimeout bounds one snapshot read after the first.
	loadTimeout time.Duration
	// errs gets a line for each failed reload when frames are not drawn on
	// a terminal (where the frame's WATCH line says it instead).
	errs io.Writer
}

func newSaleWatch(coord *coordinator.Coordinator, sku string, loadTimeout time.Duration, errs io.Writer) *saleWatch {
	return &saleWatch{coord: coord, client: coord.Client(), now: time.Now, loadTimeout: loadTimeout, errs: errs,
		state: newSaleState(engines.Of(coord).Keys, sku, time.Now())}
}

// errWatchEnded ends one watch of run: the caller reloads and watches again.
type errWatchEnded struct{ why string }

func (e *errWatchEnded) Error() string { return e.why }

// run shows a frame of the loaded state, then one per change until ctx
// ends, which is how it normally returns (nil). A compacted or lost watch
// is followed by a reload and a new watch. It returns an error only when
// the SKU is gone, a record does not decode, or the output fails.
func (w *saleWatch) run(ctx context.Context, p *watchPrinter) error {
	note := ""
	for {
		err := w.follow(ctx, p, note)
		if ctx.Err() != nil {
			return nil
		}
		var ended *errWatchEnded
		if !errors.As(err, &ended) {
			return err
		}
		if note, err = w.reload(ctx, p, ended.why); err != nil || ctx.Err() != nil {
			return err
		}
	}
}

// follow watches from the state's revision on, showing each change (at
// most every watchRedraw on a terminal), until the watch ends or ctx does.
// note goes on its first frame.
func (w *saleWatch) follow(ctx context.Context, p *watchPrinter, note string) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel() // ends the watch on every return
	// WithRequireLeader: a member cut off from its cluster ends the watch
	// instead of leaving it silent, and the reload reaches a member that
	// has a leader.
	wch := w.client.Watch(clientv3.WithRequireLeader(wctx), engines.Of(w.coord).Keys.Prefix(), clientv3.WithPrefix(),
		clientv3.WithRev(w.state.loadRev+1))

	var (
		dirty    = true // the loaded state is not shown yet
		lastDraw time.Time
		redraw   = time.NewTimer(0) // fires when a pending frame may be drawn
		tick     <-chan time.Time
	)
	defer redraw.Stop()
	if p.tty {
		t := time.NewTicker(watchTick)
		defer t.Stop()
		tick = t.C
	}
	show := func() error {
		v := w.state.view(w.now())
		v.Note, note = note, ""
		dirty, lastDraw = false, w.now()
		if _, err := p.print(v); err != nil {
			return fmt.Errorf("write the view: %w", err)
		}
		return nil
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick:
			if err := show(); err != nil {
				return err
			}
			continue
		case <-redraw.C:
			if dirty {
				if err := show(); err != nil {
					return err
				}
			}
			continue
		case resp, ok := <-wch:
			switch {
			case !ok:
				if ctx.Err() != nil {
					return ctx.Err()
				}
				return &errWatchEnded{why: "the watch ended"}
			case resp.CompactRevision != 0:
				return &errWatchEnded{why: fmt.Sprintf("etcd compacted revision %d, which the watch had not reached", resp.CompactRevision)}
			case resp.Err() != nil:
				return &errWatchEnded{why: fmt.Sprintf("the watch was lost: %v", resp.Err())}
			}
			changed, err := w.state.apply(resp.Events, w.now())
			if err != nil {
				return err
			}
			dirty = dirty || changed
		}
		if !dirty {
			continue
		}
		if !p.tty {
			// Off a terminal every change is printed: a script reading
			// the lines wants each state, and nothing is drawn over.
			if err := show(); err != nil {
				return err
			}
			continue
		}
		if wait := watchRedraw - w.now().Sub(lastDraw); wait > 0 {
			// Coalesce: the timer shows whatever the state is then.
			redraw.Reset(wait)
			continue
		}
		if err := show(); err != nil {
			return err
		}
	}
}

// reload reads the snapshot again after the watch ended for why, trying
// until it succeeds or ctx ends. While it fails, the last state is shown
// with what went wrong. It returns the note for the first frame after it.
// An error is returned only when retrying cannot help: the SKU is gone.
func (w *saleWatch) reload(ctx context.Context, p *watchPrinter, why string) (string, error) {
	wait := watchRetryMin
	for attempt := 1; ; attempt++ {
		lctx, cancel := context.WithTimeout(ctx, w.loadTimeout)
		err := w.state.load(lctx, w.coord)
		cancel()
		if err == nil {
			return fmt.Sprintf("reloaded at revision %d: %s", w.state.loadRev, why), nil
		}
		if ctx.Err() != nil {
			return "", nil
		}
		if errors.Is(err, coordinator.ErrUnknownSKU) {
			return "", err
		}
		msg := fmt.Sprintf("%s; reading the snapshot again failed (attempt %d): %v; retrying in %v", why, attempt, err, wait)
		if p.tty {
			v := w.state.view(w.now())
			v.Note = msg
			if _, err := p.print(v); err != nil {
				return "", fmt.Errorf("write the view: %w", err)
			}
		} else {
			fmt.Fprintf(w.errs, "stockctl: status --watch %s: %s\n", w.state.sku, msg)
		}
		select {
		case <-ctx.Done():
			return "", nil
		case <-time.After(wait):
		}
		wait = min(2*wait, watchRetryMax)
	}
}

// watchStatus is status --watch: it shows sku's stock, and again on every
// change, until interrupted (exit 0). --timeout bounds only the setup.
func watchStatus(c *ucli.Context, g *globals, sku string) error {
	ctx, stop := signalContext(c)
	defer stop()
	sctx, cancel := g.boundedContext(ctx)
	defer cancel()
	cn, err := connect(sctx, c, g)
	if err != nil {
		return interruptedIsOK(ctx, err)
	}
	defer cn.Close()
	loadTimeout := g.timeout
	if loadTimeout <= 0 {
		loadTimeout = DefaultTimeout
	}
	// With several clusters: watch the SKU's own cluster.
	in := cn.coord
	if cn.coord.Clusters() != nil {
		where, err := cn.coord.ClusterOf(sctx, sku)
		if err != nil {
			return opFailed(sctx, err)
		}
		in = cn.coord.Cluster(where)
	}
	w := newSaleWatch(in, sku, loadTimeout, c.App.ErrWriter)
	if err := w.state.load(sctx, in); errors.Is(err, coordinator.ErrUnknownSKU) {
		cancel()
		// Until it exists: a wait, not setup, so not bounded by --timeout.
		if err := w.waitForSKU(ctx, c.App.ErrWriter); err != nil {
			return interruptedIsOK(ctx, opFailed(ctx, err))
		}
	} else if err != nil {
		return interruptedIsOK(ctx, opFailed(sctx, err))
	}
	cancel()

	where := fmt.Sprintf("etcd %s, prefix %s", strings.Join(cn.endpoints, ","), g.prefix)
	if cn.server != nil {
		// Nobody else can write to an embedded etcd's data dir while this
		// runs: the view will not move. Say so where it is seen.
		where = fmt.Sprintf("the embedded etcd in %s, prefix %s: no other process can change it while this runs "+
			"(run `stockctl serve`, and watch with --endpoints)", g.dataDir, g.prefix)
	}
	tty := isTerminal(c.App.Writer)
	if cn.server != nil && (!tty || g.output == outputJSON) {
		fmt.Fprintf(c.App.ErrWriter, "stockctl: status --watch %s: watching %s\n", sku, where)
	}
	p := newWatchPrinter(c.App.Writer, g.output, tty, "status --watch "+sku+" · ^C to stop", where)
	defer p.close()
	if err := w.run(ctx, p); err != nil {
		return failed(ctx, "watch "+sku, err)
	}
	return nil
}

// interruptedIsOK turns the error of a setup cut short by an interrupt
// into a normal end: ^C is how status --watch ends, whenever it comes.
func interruptedIsOK(ctx context.Context, err error) error {
	if errors.Is(context.Cause(ctx), errInterrupted) {
		return nil
	}
	return err
}
