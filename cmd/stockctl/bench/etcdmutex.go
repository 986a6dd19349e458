package bench

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/segments"
)

// mutexSessionTTL is the lease TTL of the stock-Mutex strategies' sessions,
// the same as the coordinator's default so that neither is favoured.
const mutexSessionTTL = int(coordinator.DefaultSessionTTL / time.Second)

// cleanupTimeout bounds each cleanup step (an unlock, closing sessions,
// deleting a run's keys).
const cleanupTimeout = 10 * time.Second

// maxPutsPerTxn keeps setup transactions well inside etcd's default
// --max-txn-ops (128).
const maxPutsPerTxn = 64

// OneLock is the seed's baseline: one stock counter for the whole stock,
// guarded by one etcd concurrency.Mutex, whatever the segment count.
func OneLock() Spec {
	return Spec{Name: "one-lock", Title: "one etcd Mutex around the whole stock", Step: true, OneKey: true,
		New: func() Strategy { return &etcdMutex{oneKey: true} }}
}

// EtcdMutex is the naive etcd way: a stock counter per segment, each guarded
// by its own stock concurrency.Mutex, one session per buyer (a Mutex is
// reentrant per session, so goroutines sharing one would hold it together).
func EtcdMutex() Spec {
	return Spec{Name: "etcd-mutex", Title: "stock etcd Mutex per segment, session per buyer", Step: true,
		New: func() Strategy { return &etcdMutex{} }}
}

// etcdMutex sells with concurrency.Mutex: lock the place, read its counter
// and the order's record, check, run the step, then write the deduction and
// the record in one transaction fenced by the Mutex (IsOwner), and unlock.
type etcdMutex struct {
	oneKey   bool
	p        Params
	places   int
	sessions []*concurrency.Session // one per buyer
}

func (m *etcdMutex) counter(i int) string   { return fmt.Sprintf("%sstock/%d", m.p.Prefix, i) }
func (m *etcdMutex) lock(i int) string      { return fmt.Sprintf("%slock/%d", m.p.Prefix, i) }
func (m *etcdMutex) record(o string) string { return m.p.Prefix + "order/" + o }

func (m *etcdMutex) Setup(ctx context.Context, p Params) error {
	m.p, m.places = p, p.Segments
	if m.oneKey {
		m.places = 1
	}
	cli := p.Etcd[0]
	for i := 0; i < m.places; i += maxPutsPerTxn {
		var ops []clientv3.Op
		for j := i; j < min(i+maxPutsPerTxn, m.places); j++ {
			ops = append(ops, clientv3.OpPut(m.counter(j), strconv.FormatInt(p.Units, 10)))
		}
		if _, err := cli.Txn(ctx).Then(ops...).Commit(); err != nil {
			return fmt.Errorf("put the stock counters: %w", err)
		}
	}
	m.sessions = make([]*concurrency.Session, p.Buyers)
	for b := range m.sessions {
		// The session's keepalive lives as long as the client; ctx bounds
		// only the lease grant.
		s, err := concurrency.NewSession(p.Etcd[p.Process(b)], concurrency.WithTTL(mutexSessionTTL),
			concurrency.WithContext(context.WithoutCancel(ctx)))
		if err != nil {
			return fmt.Errorf("start buyer %d's session: %w", b, err)
		}
		m.sessions[b] = s
	}
	return nil
}

func (m *etcdMutex) Buy(ctx context.Context, buyer int, order string, qty int64, routeKey string) (replayed bool, err error) {
	place := 0
	if !m.oneKey {
		place = segments.Route(routeKey, m.places)
	}
	s := m.sessions[buyer]
	cli := s.Client()
	mu := concurrency.NewMutex(s, m.lock(place))
	if err := mu.Lock(ctx); err != nil {
		return false, fmt.Errorf("lock place %d: %w", place, err)
	}
	defer func() {
		// A fresh ctx: the unlock must happen even when ctx has ended.
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		if uerr := mu.Unlock(uctx); uerr != nil && err == nil {
			err = fmt.Errorf("unlock place %d: %w", place, uerr)
		}
	}()
	resp, err := cli.Txn(ctx).Then(clientv3.OpGet(m.counter(place)), clientv3.OpGet(m.record(order))).Commit()
	if err != nil {
		return false, fmt.Errorf("read place %d: %w", place, err)
	}
	if len(resp.Responses[1].GetResponseRange().Kvs) > 0 {
		return true, nil
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 {
		return false, fmt.Errorf("place %d has no stock counter", place)
	}
	have, err := strconv.ParseInt(string(kvs[0].Value), 10, 64)
	if err != nil {
		return false, fmt.Errorf("place %d: bad counter %q: %w", place, kvs[0].Value, err)
	}
	if have < qty {
		return false, fmt.Errorf("place %d: want %d, have %d: %w", place, qty, have, coordinator.ErrInsufficientStock)
	}
	if m.p.Step != nil {
		if err := m.p.Step(ctx, buyer); err != nil {
			return false, err
		}
	}
	tresp, err := cli.Txn(ctx).If(mu.IsOwner()).Then(
		clientv3.OpPut(m.counter(place), strconv.FormatInt(have-qty, 10)),
		clientv3.OpPut(m.record(order), strconv.FormatInt(qty, 10)),
	).Commit()
	if err != nil {
		return false, fmt.Errorf("deduct at place %d: %w", place, err)
	}
	if !tresp.Succeeded {
		return false, fmt.Errorf("deduct at place %d: %w", place, errLockLost)
	}
	return false, nil
}

// errLockLost: a fenced write found that the lock had been lost.
var errLockLost = errors.New("lock lost before the deduction")

func (m *etcdMutex) Verify(ctx context.Context) (Books, error) {
	b := Books{Stock: int64(m.places) * m.p.Units}
	return b, readBooks(ctx, m.p.Etcd[0], m.p.Prefix+"stock/", m.p.Prefix+"order/", &b)
}

func (m *etcdMutex) Teardown(ctx context.Context) error {
	var errs []error
	for _, s := range m.sessions {
		if s != nil {
			errs = append(errs, s.Close())
		}
	}
	if len(m.p.Etcd) > 0 {
		errs = append(errs, deletePrefix(ctx, m.p.Etcd[0], m.p.Prefix))
	}
	return errors.Join(errs...)
}

// readBooks sums the integer counters under counters and the order records
// under orders, all at one revision, into b.
func readBooks(ctx context.Context, cli *clientv3.Client, counters, orders string, b *Books) error {
	rev, err := scan(ctx, cli, counters, 0, func(k, v []byte) error {
		n, err := strconv.ParseInt(string(v), 10, 64)
		if err != nil {
			return fmt.Errorf("counter %s: bad value %q", k, v)
		}
		b.Remaining += n
		if n < 0 {
			b.Negative -= n
		}
		return nil
	})
	if err != nil {
		return err
	}
	_, err = scan(ctx, cli, orders, rev, func(k, v []byte) error {
		n, err := strconv.ParseInt(string(v), 10, 64)
		if err != nil || n < 1 {
			b.Problems = append(b.Problems, fmt.Sprintf("order record %s: bad quantity %q", k, v))
			return nil
		}
		b.Sold += n
		b.Orders++
		return nil
	})
	return err
}

// scanPage is how many keys scan reads per request.
const scanPage = 5000

// scan calls f for every key under prefix at revision rev (0: the current
// one), a page at a time, and returns the revision it read at.
func scan(ctx context.Context, cli *clientv3.Client, prefix string, rev int64, f func(k, v []byte) error) (int64, error) {
	key, end := prefix, clientv3.GetPrefixRangeEnd(prefix)
	for {
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(scanPage), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend)}
		if rev > 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		resp, err := cli.Get(ctx, key, opts...)
		if err != nil {
			return rev, fmt.Errorf("read %s: %w", prefix, err)
		}
		rev = resp.Header.Revision
		for _, kv := range resp.Kvs {
			if err := f(kv.Key, kv.Value); err != nil {
				return rev, err
			}
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return rev, nil
		}
		key = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}

// deletePrefix deletes a run's keys, within cleanupTimeout.
func deletePrefix(ctx context.Context, cli *clientv3.Client, prefix string) error {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	if _, err := cli.Delete(dctx, prefix, clientv3.WithPrefix()); err != nil {
		return fmt.Errorf("delete %s: %w", prefix, err)
	}
	return nil
}
