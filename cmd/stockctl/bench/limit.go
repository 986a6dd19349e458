package bench

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// The physical limit. A sale's rate on etcd is etcd's rate of keys at the
// batch size its commits reach, divided by the keys each order writes. The
// limit shapes measure the first factor on the same etcd as the sale rows
// (the same clients, fsync settings and concurrency), with no logic at
// all: each of the sale's processes is one writer that puts Batch new
// keys of an order's size in one transaction, waits for it to commit, and
// puts the next Batch, until the run's duration or LimitMaxPuts. Each put
// is one would-be order: the row's orders/s is the most orders/s that etcd
// could take at one key per order and Batch orders a commit.

// LimitStrategy names the physical-limit rows' strategy.
const LimitStrategy = "etcd-put"

// Physical-limit parameters.
const (
	// DefaultLimitBatch is the batch of the default limit shape: 64 puts
	// a transaction.
	DefaultLimitBatch = 64
	// LimitValueBytes is the size of each put's value: an order record's.
	LimitValueBytes = 200
	// LimitMaxPuts bounds a limit row's puts (and so its keys on disk,
	// about 300 bytes each with the key): the row stops at whichever of
	// the duration and this comes first.
	LimitMaxPuts = 1_000_000
)

// LimitShape is the physical-limit shape at batch puts a transaction,
// named limit-BATCH.
func LimitShape(batch int) SaleShape {
	return SaleShape{Name: "limit-" + strconv.Itoa(batch), Batch: batch}
}

// limitKey is writer w's i-th key under prefix.
func limitKey(prefix string, w int, i int64) string {
	return fmt.Sprintf("%slimit/w%d/%012d", prefix, w, i)
}

// runLimitOne runs a physical-limit shape: cfg.Processes writers (or
// cfg.LimitWriters), each on its process's etcd client, putting sh.Batch
// new keys a transaction.
func runLimitOne(ctx context.Context, cfg *SaleConfig, sh SaleShape) (row SaleRow) {
	writers := cfg.Processes
	if cfg.LimitWriters > 0 {
		writers = cfg.LimitWriters
	}
	row = SaleRow{Strategy: LimitStrategy, Shape: sh, Buyers: writers, Problems: []string{}}
	prefix := fmt.Sprintf("%slimit-%d-%08x/", cfg.Prefix, sh.Batch, time.Now().UnixNano()&0xffffffff)
	defer func() {
		// The run's keys go; whatever the run did, its row says.
		if err := deletePrefix(ctx, cfg.Etcd[0], prefix); err != nil {
			row.Problems = append(row.Problems, "teardown: "+err.Error())
			row.OK = false
		}
	}()
	value := strings.Repeat("o", LimitValueBytes)
	maxPuts := cfg.LimitMaxPuts
	if maxPuts <= 0 {
		maxPuts = LimitMaxPuts
	}
	perWriter := max(maxPuts/int64(writers)/int64(sh.Batch), 1)
	type writer struct {
		puts, errors, txns int64
		lat                []time.Duration
		firstErr           error
	}
	ws := make([]writer, writers)
	w := startWindow(cfg, true)
	start := time.Now()
	deadline := start.Add(cfg.Duration)
	var wg sync.WaitGroup
	for i := range ws {
		wg.Go(func() {
			me := &ws[i]
			cli := cfg.Etcd[i%cfg.Processes]
			ops := make([]clientv3.Op, sh.Batch)
			var next int64
			for n := int64(0); n < perWriter && time.Now().Before(deadline) && ctx.Err() == nil; n++ {
				for j := range ops {
					ops[j] = clientv3.OpPut(limitKey(prefix, i, next), value)
					next++
				}
				actx, cancel := context.WithTimeout(ctx, cfg.AttemptTimeout)
				t0 := time.Now()
				_, err := cli.Txn(actx).Then(ops...).Commit()
				lat := time.Since(t0)
				cancel()
				me.txns++
				if err != nil {
					me.errors++
					if me.firstErr == nil {
						me.firstErr = err
					}
					continue
				}
				me.puts += int64(sh.Batch)
				me.lat = append(me.lat, lat)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	w.end(&row)
	row.Seconds = elapsed.Seconds()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	row.Goroutines, row.HeapMiB = runtime.NumGoroutine(), float64(ms.HeapInuse)/(1<<20)
	var lats []time.Duration
	for _, me := range ws {
		row.Orders += me.puts
		row.Errors += me.errors
		if me.firstErr != nil && row.FirstError == "" {
			row.FirstError = me.firstErr.Error()
		}
		lats = append(lats, me.lat...)
	}
	slices.Sort(lats)
	row.ServedMs = latencyOf(lats)
	row.OrdersPerSec = float64(row.Orders) / elapsed.Seconds()
	row.Costs = orderCosts(row.Orders, row.Etcd, row.EtcdServer)
	row.Costs.addCPU(row.CPUSeconds, row.Orders)

	// The books: every committed put is a key under the prefix; a failed
	// transaction may or may not have committed (all its keys or none).
	vctx, cancel := context.WithTimeout(Uncounted(context.WithoutCancel(ctx)), cfg.SetupTimeout)
	defer cancel()
	resp, err := cfg.Etcd[0].Get(vctx, prefix+"limit/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	switch {
	case err != nil:
		row.Problems = append(row.Problems, "count the keys: "+err.Error())
	case resp.Count < row.Orders || resp.Count > row.Orders+row.Errors*int64(sh.Batch):
		row.Problems = append(row.Problems, fmt.Sprintf("%d keys under the prefix for %d puts committed (%d transactions failed)", resp.Count, row.Orders, row.Errors))
	}
	if row.Errors > 0 {
		row.Problems = append(row.Problems, fmt.Sprintf("%d transactions failed (first error: %s)", row.Errors, row.FirstError))
	}
	row.OK = len(row.Problems) == 0
	return row
}
