package segments

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
)

// Preparing a sale. A process's first direct order of a SKU costs more
// than the ones after it: a peek at its segment before it is sold, and,
// with lazy segments, a second key in its commit (the counter, rewritten
// to name this process as the segment's owner) and the compares that go
// with that. In a sale of thousands of SKUs that opens at once, nearly
// every early order is such a first one: over 10,000 SKUs and 4 processes
// a 3-second sale wrote 1.9 keys an order against 1.1 over 1,000 SKUs
// (docs/benchmarks.md). Prepare pays those costs before the sale opens,
// for many SKUs a transaction: the peeks share look transactions, and the
// takeovers go up to MaxTxnOps/4 a transaction. The first orders then sell
// as every later one does: one key (the order's record) and two compares.

// CheckSKUs returns an error naming the SKUs of names that are invalid
// or unknown (not created, or deleted), nil when there are none: what
// Prepare checks before it does anything.
func (e *Engine) CheckSKUs(ctx context.Context, names []string) error {
	_, err := e.knownSKUs(ctx, names)
	return err
}

// knownSKUs is the SKUs of names, each once, or an error naming the first
// invalid name or the unknown SKUs.
func (e *Engine) knownSKUs(ctx context.Context, skus []string) ([]*skuInfo, error) {
	names := make([]string, 0, len(skus))
	seen := map[string]bool{}
	for _, n := range skus {
		if err := ValidateSKU(n); err != nil {
			return nil, fmt.Errorf("prepare: %w", err)
		}
		if !seen[n] {
			seen[n] = true
			names = append(names, n)
		}
	}
	infos := make([]*skuInfo, 0, len(names))
	var unknown []string
	for _, n := range names {
		info, err := e.sku(ctx, n)
		switch {
		case errors.Is(err, ErrUnknownSKU):
			unknown = append(unknown, n)
		case err != nil:
			return nil, fmt.Errorf("prepare %s: %w", n, err)
		default:
			infos = append(infos, info)
		}
	}
	if len(unknown) > 0 {
		shown := unknown[:min(len(unknown), 5)]
		more := ""
		if len(unknown) > len(shown) {
			more = fmt.Sprintf(" and %d more", len(unknown)-len(shown))
		}
		return nil, fmt.Errorf("prepare: %w: %s%s (nothing prepared)", ErrUnknownSKU, strings.Join(shown, ", "), more)
	}
	return infos, nil
}

// Prepared is what Prepare did.
type Prepared struct {
	// SKUs is how many distinct SKUs were asked for.
	SKUs int `json:"skus"`
	// Ready counts the SKUs whose next direct order in this process has its
	// segment known (peeked, or known already): it sells without a read
	// first.
	Ready int `json:"ready"`
	// Owned counts the segments this process owns for lazy sales after
	// Prepare (taken over by it, or owned already); 0 with eager segments.
	Owned int `json:"owned"`
	// Skipped counts the SKUs left to their first order: this process
	// holds one of their segment locks (it sells from those), or the
	// segment it would sell from is locked, sold lazily by another process
	// or empty. Their first order takes the usual path.
	Skipped int `json:"skipped"`
}

// prepareWorkers bounds the SKUs Prepare peeks at once (the peeks of the
// moment share look transactions).
const prepareWorkers = 64

// Prepare readies this process to sell skus directly, before their first
// orders: it claims the process's seat, peeks at each SKU's direct segment
// for this process, and with lazy segments takes those segments over, many
// SKUs a transaction (see Prepared). It writes no stock: a takeover
// rewrites a segment's counter with the same units, naming this process.
//
// What it prepares lasts while the SKU's seller is kept: call it shortly
// before the sale opens (within SellerIdle of the first orders; a SKU
// unused that long is forgotten and its next order starts cold again).
// Another process's order on the segment, a lock holder or a refill end
// nothing but the shortcut: the order climbs the ladder as always.
//
// Every name is checked before anything is read: an invalid or unknown SKU
// is an error naming it, and nothing is prepared.
func (e *Engine) Prepare(ctx context.Context, skus []string) (*Prepared, error) {
	infos, err := e.knownSKUs(ctx, skus)
	if err != nil {
		return nil, err
	}

	// The seat first: it decides each SKU's direct home (directHome).
	e.seat.Start()
	e.seat.Wait(ctx, prepareSeatWait)

	out := &Prepared{SKUs: len(infos)}
	var (
		mu      sync.Mutex
		todo    []*takeover
		owned   = map[*placeState]bool{}
		first   error
		sellers []*seller
	)
	defer func() {
		for _, s := range sellers {
			s.release() // kept for SellerIdle from now (reap.go)
		}
	}()
	work := make(chan *skuInfo)
	var wg sync.WaitGroup
	for range min(prepareWorkers, len(infos)) {
		wg.Go(func() {
			for info := range work {
				s, err := e.seller(info)
				var t *takeover
				var ready, own bool
				if err == nil {
					t, ready, own, err = s.prepare(ctx)
				}
				mu.Lock()
				if s != nil {
					sellers = append(sellers, s)
				}
				switch {
				case err != nil:
					if first == nil {
						first = fmt.Errorf("prepare %s: %w", info.name, err)
					}
				case !ready:
					out.Skipped++
				default:
					out.Ready++
					if own {
						owned[s.directPlace()] = true
					}
					if t != nil {
						todo = append(todo, t)
					}
				}
				mu.Unlock()
			}
		})
	}
	for _, info := range infos {
		mu.Lock()
		stop := first != nil
		mu.Unlock()
		if stop || ctx.Err() != nil {
			break
		}
		work <- info
	}
	close(work)
	wg.Wait()
	if first == nil && ctx.Err() != nil {
		first = fmt.Errorf("prepare: %w", context.Cause(ctx))
	}
	if first != nil {
		return nil, first
	}
	lost := e.takeOver(ctx, todo)
	for _, t := range todo {
		if err, ok := lost[t.st]; ok {
			if err != nil && first == nil {
				first = fmt.Errorf("prepare %s: %w", t.info.name, err)
			}
			continue
		}
		owned[t.st] = true
	}
	out.Owned = len(owned)
	return out, first
}

// prepareSeatWait bounds Prepare's wait for the process's seat (three
// round trips to etcd); without one, directHome falls back to a hash.
const prepareSeatWait = 5 * time.Second

// prepare readies the seller's direct segment (Engine.Prepare): ready when
// its next direct order has a known segment to sell from; own when this
// process owns it for lazy sales already; t, the takeover that makes it
// owned, when it is to be taken.
func (s *seller) prepare(ctx context.Context) (t *takeover, ready, own bool, err error) {
	select {
	case <-s.viewed:
	case <-ctx.Done():
		return nil, false, false, context.Cause(ctx)
	}
	if s.heldCount() > 0 {
		return nil, false, false, nil // it sells from its held segments
	}
	lazy := s.e.cfg.LazySegments
	if st := s.directPlace(); st != nil {
		st.mu.Lock()
		d := st.direct
		st.mu.Unlock()
		if d.known {
			own = d.owned && d.owner == s.e.owner
			switch {
			case !lazy || own:
			case !s.ownableLocked(&d):
				return nil, false, false, nil // another process's: not taken from it here
			default:
				t = s.e.newTakeover(s.sku, st, d)
			}
			return t, true, own, nil
		}
	}
	// Otherwise as a first order's peek (peekDirect), but a segment this
	// process owned lazily before its seller was forgotten is taken back.
	st, err := s.peekInto(ctx, s.directHome(), 1, lazy)
	if st == nil || err != nil {
		return nil, false, false, err
	}
	if lazy {
		st.mu.Lock()
		d := st.direct
		st.mu.Unlock()
		if d.owned && d.owner == s.e.owner {
			return nil, true, true, nil // a home the SKU was born with, adopted by the peek
		}
		t = s.e.newTakeover(s.sku, st, d)
	}
	return t, true, false, nil
}
