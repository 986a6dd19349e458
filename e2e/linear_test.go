package e2e

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/engines"
)

// The sequential specification of one SKU's stock, for porcupine.
//
// State: what the pool and segments hold together (avail), the total, and
// every order with its quantity and whether it was released. Operations:
//
//	allocate(order, qty) → ok | insufficient
//	release(order)       → released(qty) | already | notfound
//	restock(qty)         → ok(total after)
//	status               → (avail, total)
//
// Where the stock sits (pool, which segment, inboxes) is not part of the
// model: the rebalancer may move it at any time without changing avail.

type linOp int

const (
	opAllocate linOp = iota
	opRelease
	opRestock
	opStatus
)

type linInput struct {
	Op    linOp
	Order string
	Qty   int64
}

type linOutput struct {
	Result string // "ok", "insufficient", "released", "already", "notfound"
	Qty    int64  // release: what was returned
	Avail  int64  // status
	Total  int64  // status, restock; -1: not known (a restock whose reply was lost)
}

type linOrder struct {
	qty      int64
	released bool
}

type linState struct {
	avail, total int64
	orders       map[string]linOrder
}

func (s linState) with(order string, o linOrder, dAvail, dTotal int64) linState {
	n := linState{avail: s.avail + dAvail, total: s.total + dTotal, orders: maps.Clone(s.orders)}
	if order != "" {
		n.orders[order] = o
	}
	return n
}

func linStep(state, input, output any) (bool, any) {
	s, in, out := state.(linState), input.(linInput), output.(linOutput)
	o, exists := s.orders[in.Order]
	switch in.Op {
	case opAllocate:
		switch out.Result {
		case "ok": // a fresh order ID: the call is what applied it
			return !exists && s.avail >= in.Qty, s.with(in.Order, linOrder{qty: in.Qty}, -in.Qty, 0)
		case "insufficient":
			return !exists && s.avail < in.Qty, s
		}
	case opRelease:
		switch out.Result {
		case "released":
			return exists && !o.released && out.Qty == o.qty, s.with(in.Order, linOrder{qty: o.qty, released: true}, o.qty, 0)
		case "already":
			return exists && o.released, s
		case "notfound":
			return !exists, s
		}
	case opRestock:
		return out.Total == -1 || out.Total == s.total+in.Qty, s.with("", linOrder{}, in.Qty, in.Qty)
	case opStatus:
		return out.Avail == s.avail && out.Total == s.total, s
	}
	return false, s
}

func linModel(avail, total int64) porcupine.Model {
	return porcupine.Model{
		Init: func() any { return linState{avail: avail, total: total, orders: map[string]linOrder{}} },
		Step: linStep,
		Equal: func(a, b any) bool {
			x, y := a.(linState), b.(linState)
			return x.avail == y.avail && x.total == y.total && maps.Equal(x.orders, y.orders)
		},
		Hash: func(a any) uint64 {
			s := a.(linState)
			h := fnv.New64a()
			fmt.Fprintf(h, "%d/%d", s.avail, s.total)
			for _, k := range slices.Sorted(maps.Keys(s.orders)) {
				fmt.Fprintf(h, "/%s:%d:%v", k, s.orders[k].qty, s.orders[k].released)
			}
			return h.Sum64()
		},
		DescribeOperation: func(input, output any) string {
			in, out := input.(linInput), output.(linOutput)
			switch in.Op {
			case opAllocate:
				return fmt.Sprintf("allocate(%s, %d) → %s", in.Order, in.Qty, out.Result)
			case opRelease:
				return fmt.Sprintf("release(%s) → %s %d", in.Order, out.Result, out.Qty)
			case opRestock:
				return fmt.Sprintf("restock(%d) → total %d", in.Qty, out.Total)
			default:
				return fmt.Sprintf("status → avail %d total %d", out.Avail, out.Total)
			}
		},
		DescribeState: func(state any) string {
			s := state.(linState)
			return fmt.Sprintf("avail %d, total %d, %d orders", s.avail, s.total, len(s.orders))
		},
	}
}

// linRecord is one call as a client saw it. unknown: the call failed in a
// way that leaves its effect unknown; resolve decides from etcd's final
// state whether it took effect.
type linRecord struct {
	client    int
	in        linInput
	out       linOutput
	call, ret time.Duration
	unknown   bool
}

// linWorkload runs a bounded mix of allocate / release / restock / status
// calls on one SKU from concurrent clients, each client's calls one after
// another, and records what each client saw.
type linWorkload struct {
	SKU     string
	Clients []*coordinator.Coordinator // one client each; the same coordinator may appear twice
	MaxOps  int                        // per client
	Timeout time.Duration              // per call
	Pace    time.Duration              // think time between a client's calls, up to twice this
	Restock int64                      // quantity of client 0's restocks

	start   time.Time
	mu      sync.Mutex
	records []linRecord
}

// run runs the workload until every client made MaxOps calls or stop is
// closed (or limit passes).
func (w *linWorkload) run(stop <-chan struct{}, limit time.Duration) {
	w.start = time.Now()
	deadline := w.start.Add(limit)
	var wg sync.WaitGroup
	for id, c := range w.Clients {
		wg.Go(func() { w.client(id, c, stop, deadline) })
	}
	wg.Wait()
}

func (w *linWorkload) client(id int, c *coordinator.Coordinator, stop <-chan struct{}, deadline time.Time) {
	rng := rand.New(rand.NewPCG(uint64(id), uint64(time.Now().UnixNano())))
	var mine []string // orders this client allocated for sure and has not released
	restocking := id == 0 && w.Restock > 0
	for n := 0; n < w.MaxOps && time.Now().Before(deadline); n++ {
		select {
		case <-stop:
			return
		case <-time.After(w.Pace/2 + rand.N(w.Pace)):
		}
		r := linRecord{client: id}
		p := rng.IntN(100)
		ctx, cancel := context.WithTimeout(context.Background(), w.Timeout)
		r.call = time.Since(w.start)
		switch {
		case p < 15 && restocking:
			r.in = linInput{Op: opRestock, Qty: w.Restock}
			res, err := c.Restock(ctx, w.SKU, fmt.Sprintf("lin-%d-%d", id, n), w.Restock)
			if err != nil {
				r.unknown = true
				restocking = false // at most one restock of unknown outcome: resolve can tell
			} else {
				r.out = linOutput{Result: "ok", Total: res.Total}
			}
		case p < 40 && len(mine) > 0:
			i := rng.IntN(len(mine))
			order := mine[i]
			mine = slices.Delete(mine, i, i+1) // released at most once, known or not
			r.in = linInput{Op: opRelease, Order: order}
			res, err := c.Release(ctx, w.SKU, order)
			switch {
			case err == nil && res.Released:
				r.out = linOutput{Result: "released", Qty: res.Qty}
			case err == nil:
				r.out = linOutput{Result: "already"}
			case errors.Is(err, coordinator.ErrOrderNotFound):
				r.out = linOutput{Result: "notfound"}
			default:
				r.unknown = true
			}
		case p < 65:
			r.in = linInput{Op: opStatus}
			st, err := c.Status(ctx, w.SKU)
			if err != nil {
				cancel()
				continue // a failed read changed nothing
			}
			r.out = linOutput{Avail: st.Remaining(), Total: st.Total}
		default:
			order := fmt.Sprintf("lin-%d-%d", id, n)
			r.in = linInput{Op: opAllocate, Order: order, Qty: 1 + rng.Int64N(3)}
			_, err := c.Allocate(ctx, w.SKU, order, r.in.Qty, order)
			switch {
			case err == nil:
				r.out = linOutput{Result: "ok"}
				mine = append(mine, order)
			case errors.Is(err, coordinator.ErrInsufficientStock):
				r.out = linOutput{Result: "insufficient"}
			default:
				r.unknown = true
			}
		}
		r.ret = time.Since(w.start)
		cancel()
		w.mu.Lock()
		w.records = append(w.records, r)
		w.mu.Unlock()
	}
}

// linFinal is the SKU's state after every client stopped and every
// coordinator that served the workload was closed, so that nothing is still
// in flight: the orders' records and the total.
type linFinal struct {
	orders map[string]linOrder
	total  int64
}

// readFinal reads sku's orders and total through c.
func readFinal(t testing.TB, c *coordinator.Coordinator, sku string, orders []string) linFinal {
	t.Helper()
	f := linFinal{orders: map[string]linOrder{}}
	for _, o := range orders {
		if rec, ok := orderState(t, c, sku, o); ok {
			f.orders[o] = linOrder{qty: rec.Qty, released: rec.Released}
		}
	}
	retry(t, "read meta", 20*time.Second, anyErr, func(ctx context.Context) error {
		m, _, err := engines.Of(c).Stock.Meta(ctx, sku)
		f.total = m.Total
		return err
	})
	return f
}

// history turns the records into porcupine operations, resolving each call
// of unknown outcome from the final state: one that took effect is given
// the outcome it had and a return time after everything else (it may have
// taken effect at any point after its call); one that did not is left out,
// as a call that changed nothing. It also returns how many calls were
// unknown and how many of those took effect.
func (w *linWorkload) history(t testing.TB, initialTotal int64, final linFinal) (ops []porcupine.Operation, unknown, applied int) {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	var last time.Duration
	for _, r := range w.records {
		last = max(last, r.ret)
	}
	never := int64(last) + int64(time.Hour)
	knownTotal := initialTotal
	for _, r := range w.records {
		if r.in.Op == opRestock && !r.unknown {
			knownTotal += r.in.Qty
		}
	}
	for _, r := range w.records {
		op := porcupine.Operation{ClientId: r.client, Input: r.in, Output: r.out, Call: int64(r.call), Return: int64(r.ret)}
		if r.unknown {
			unknown++
			o, recorded := final.orders[r.in.Order]
			took := false
			switch r.in.Op {
			case opAllocate:
				took, op.Output = recorded, linOutput{Result: "ok"}
			case opRelease:
				took, op.Output = recorded && o.released, linOutput{Result: "released", Qty: o.qty}
			case opRestock:
				switch final.total - knownTotal {
				case r.in.Qty:
					took = true
				case 0:
				default:
					t.Fatalf("total %d: known restocks explain %d, and the one restock of unknown outcome was of %d", final.total, knownTotal, r.in.Qty)
				}
				op.Output = linOutput{Result: "ok", Total: -1}
			}
			if !took {
				continue
			}
			applied++
			op.Return = never
		}
		ops = append(ops, op)
	}
	sort.SliceStable(ops, func(i, j int) bool { return ops[i].Call < ops[j].Call })
	return ops, unknown, applied
}

// orders lists every order ID the workload tried to allocate.
func (w *linWorkload) orders() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for _, r := range w.records {
		if r.in.Op == opAllocate {
			out = append(out, r.in.Order)
		}
	}
	return out
}

// checkLinearizable checks ops against the model and fails t unless they
// are linearizable, leaving a visualization in a temp dir when not.
func checkLinearizable(t testing.TB, model porcupine.Model, ops []porcupine.Operation) {
	t.Helper()
	start := time.Now()
	res, info := porcupine.CheckOperationsVerbose(model, ops, 60*time.Second)
	t.Logf("porcupine: %d operations checked in %v: %s", len(ops), time.Since(start).Round(time.Millisecond), res)
	if res == porcupine.Ok {
		return
	}
	path := filepath.Join(t.TempDir(), "linearizability.html")
	if err := porcupine.VisualizePath(model, info, path); err != nil {
		t.Logf("visualize: %v", err)
	}
	t.Fatalf("history is %s, not linearizable (visualization: %s; it is removed with the test's temp dir, rerun with a debugger or copy it)", res, path)
}

// runLinearizability runs w until stop is closed, closes closeAfter (the
// workload's own coordinators, so that nothing is left in flight), reads
// the final state through reader and checks the history.
func runLinearizability(t testing.TB, w *linWorkload, initialAvail, initialTotal int64, stop <-chan struct{}, closeAfter []*coordinator.Coordinator, reader *coordinator.Coordinator) func() {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.run(stop, 2*time.Minute)
	}()
	return func() {
		t.Helper()
		<-done
		for _, c := range closeAfter {
			c.Close()
		}
		final := readFinal(t, reader, w.SKU, w.orders())
		ops, unknown, applied := w.history(t, initialTotal, final)
		t.Logf("linearizability %s: %d calls by %d clients, %d of unknown outcome (%d of them took effect)",
			w.SKU, len(w.records), len(w.Clients), unknown, applied)
		checkLinearizable(t, linModel(initialAvail, initialTotal), ops)
	}
}
