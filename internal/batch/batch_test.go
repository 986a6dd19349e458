package batch

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// recorder is a Batcher's Commit that hands each batch to the test and
// holds its goroutine until the test releases it.
type recorder struct {
	started chan []int
	release chan struct{}
}

func newRecorder() *recorder {
	return &recorder{started: make(chan []int, 16), release: make(chan struct{})}
}

func (r *recorder) commit(_ context.Context, batch []int) {
	r.started <- batch
	<-r.release
}

// takeUpTo is a Select taking the oldest n requests, and a Spill telling
// whether it left some behind.
func takeUpTo(n int) (sel func([]int) ([]int, []int), spill func() bool) {
	var left bool
	return func(q []int) ([]int, []int) {
		k := min(n, len(q))
		left = k < len(q)
		return append([]int(nil), q[:k]...), append(q[:0:0], q[k:]...)
	}, func() bool { return left }
}

// start sets b.Go to start goroutines the test waits for (r's batches
// released at its end), and returns how many it started so far (Submit
// starts them synchronously).
func start(t *testing.T, b *Batcher[int], r *recorder) (started func() int64) {
	var wg sync.WaitGroup
	var n atomic.Int64
	t.Cleanup(func() {
		close(r.release) // whatever the test left in flight ends
		wg.Wait()
	})
	b.Go = func(f func(context.Context)) bool {
		n.Add(1)
		wg.Go(func() { f(context.Background()) })
		return true
	}
	return n.Load
}

// expect reads the next batch started and checks it.
func expect(t *testing.T, r *recorder, want ...int) {
	t.Helper()
	got := <-r.started
	if len(got) != len(want) {
		t.Fatalf("batch %v; want %v", got, want)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("batch %v; want %v", got, want)
		}
	}
}

// idle checks that no goroutine started beyond want, and no batch beyond
// those read.
func idle(t *testing.T, r *recorder, started func() int64, want int64, why string) {
	t.Helper()
	if n := started(); n != want {
		t.Fatalf("%d committing goroutines started; want %d: %s", n, want, why)
	}
	select {
	case got := <-r.started:
		t.Fatalf("batch %v started: %s", got, why)
	default:
	}
}

func TestParallelStartsABatchBesideOneInFlight(t *testing.T) {
	r := newRecorder()
	sel, _ := takeUpTo(3)
	b := &Batcher[int]{Parallel: 2, Select: sel, Commit: r.commit}
	started := start(t, b, r)
	b.Submit(1)
	expect(t, r, 1)
	b.Submit(2) // a second goroutine takes it while the first is in flight
	expect(t, r, 2)
	b.Submit(3) // both in flight: it waits
	idle(t, r, started, 2, "two batches are in flight")
	r.release <- struct{}{}
	expect(t, r, 3)
}

// With SpillOnly, what arrives while a batch is in flight waits for the
// next one, unless the last batch selected was full (more waited than a
// batch takes): then a second batch goes beside the first.
func TestSpillOnlyWaitsForTheBatchInFlight(t *testing.T) {
	r := newRecorder()
	sel, spill := takeUpTo(2)
	b := &Batcher[int]{Parallel: 2, SpillOnly: true, Select: sel, Spill: spill, Commit: r.commit}
	started := start(t, b, r)
	b.Submit(1)
	expect(t, r, 1)
	for i := 2; i <= 4; i++ {
		b.Submit(i)
	}
	idle(t, r, started, 1, "the first selection left nothing behind: the next batch waits for it")
	r.release <- struct{}{}
	expect(t, r, 2, 3) // full, 4 left behind
	b.Submit(5)        // ... so this starts a batch beside the one in flight
	expect(t, r, 4, 5)
	b.Submit(6)
	idle(t, r, started, 2, "that batch was not full")
	// One of the two is answered: the last batch was not full, so its
	// goroutine ends its turn; 6 waits for the other to be answered.
	r.release <- struct{}{}
	select {
	case got := <-r.started:
		t.Fatalf("batch %v started beside the one in flight, which was not full", got)
	case <-time.After(100 * time.Millisecond):
	}
	r.release <- struct{}{}
	expect(t, r, 6)
}
