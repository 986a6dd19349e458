package e2e

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/etcdtest"
)

// History checks of read-write locks and semaphores. Every holder, once it
// holds, puts a marker under a prefix of the test's: bound to its hold's
// lease and fenced by the hold (Lock.Txn), so a marker exists only while
// its holder's key does (a lease's end deletes both in one revision), and a
// holder whose key is gone cannot put or delete one. It deletes its marker
// (fenced) before it unlocks. Replaying the markers' history from etcd, at
// every revision: a semaphore has at most its limit of markers, and an
// exclusive marker of a lock is alone. Faults are injected on top: a holder
// paused past its TTL, a process killed holding permits, a client cut off.

// marker kinds
const (
	markExclusive = "x"
	markShared    = "s"
	markPermit    = "p"
)

// holdMarked takes kind of name with c, puts its marker (fenced), runs
// work, deletes the marker (fenced) and unlocks. It reports whether the
// marker was put (false: the hold was lost first).
func holdMarked(ctx context.Context, c *coordinator.Coordinator, kind, name string, limit int, marker string, work func(*coordinator.Lock)) (bool, error) {
	var l *coordinator.Lock
	var err error
	switch kind {
	case markShared:
		l, err = c.RLock(ctx, name)
	case markPermit:
		l, err = c.AcquirePermit(ctx, name, limit)
	default:
		l, err = c.Lock(ctx, name)
	}
	if err != nil {
		return false, err
	}
	val := fmt.Sprintf("%s %d %d %s", kind, l.Token(), l.Revision(), l.Key()) // parsed by parseMarker
	tr, err := l.Txn(ctx).Then(clientv3.OpPut(marker, val, clientv3.WithLease(l.Lease()))).Commit()
	put := err == nil && tr.Succeeded
	if put {
		if work != nil {
			work(l)
		}
		_, _ = l.Txn(ctx).Then(clientv3.OpDelete(marker)).Commit()
	}
	uerr := l.Unlock(ctx)
	if err == nil && errors.Is(uerr, coordinator.ErrLockLost) {
		err = nil // a lost hold: its marker went with its lease
	}
	return put, err
}

// histLoad runs holders: each goroutine of each coordinator takes name
// ops times, shared with probability shared (for a lock) or a permit (for a
// semaphore: limit > 0), until stop. It returns a wait function and the
// count of holds that put their marker.
func histLoad(ctx context.Context, t *testing.T, cs []*coordinator.Coordinator, perCoord, ops int, name string, limit int,
	shared float64, markers string, stop *atomic.Bool) (wait func(), holds *atomic.Int64) {
	holds = &atomic.Int64{}
	var wg sync.WaitGroup
	for ci, c := range cs {
		for g := range perCoord {
			wg.Go(func() {
				for i := 0; i < ops && !stop.Load(); i++ {
					kind := markExclusive
					switch {
					case limit > 0:
						kind = markPermit
					case rand.Float64() < shared:
						kind = markShared
					}
					marker := fmt.Sprintf("%s%d-%d-%d", markers, ci, g, i)
					put, err := holdMarked(ctx, c, kind, name, limit, marker, nil)
					if err != nil && ctx.Err() == nil && !errors.Is(err, coordinator.ErrSessionLost) {
						t.Errorf("holder %d/%d: %v", ci, g, err)
						return
					}
					if put {
						holds.Add(1)
					}
				}
			})
		}
	}
	return wg.Wait, holds
}

// markerEvent is one change of a marker.
type markerEvent struct {
	rev     int64
	key     string
	kind    string // "" for a deletion
	token   int64  // the hold's fencing token (0: not recorded)
	keyRev  int64  // the create revision of the hold's etcd key (Lock.Revision)
	lockKey string // the hold's etcd key
}

// parseMarker reads a marker's value: "kind token revision lockKey", or a
// bare kind.
func parseMarker(e *markerEvent, val string) {
	f := strings.Fields(val)
	if len(f) > 0 {
		e.kind = f[0]
	}
	if len(f) == 4 {
		e.token, _ = strconv.ParseInt(f[1], 10, 64)
		e.keyRev, _ = strconv.ParseInt(f[2], 10, 64)
		e.lockKey = f[3]
	}
}

// checkMarkers reads the markers' history under prefix from revision from
// to now, and fails t where replayMarkers finds a violation. It returns the
// number of revisions checked and the most markers seen at once.
func checkMarkers(t *testing.T, cli *clientv3.Client, prefix string, from int64, limit int) (revs, most int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sentinel := prefix + "~end"
	_, err := cli.Put(ctx, sentinel, "")
	if err != nil {
		t.Fatal(err)
	}
	var evs []markerEvent
	for wr := range cli.Watch(ctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(from)) {
		if err := wr.Err(); err != nil {
			t.Fatalf("history watch: %v", err)
		}
		done := false
		for _, ev := range wr.Events {
			key := string(ev.Kv.Key)
			if key == sentinel {
				done = true
				continue
			}
			e := markerEvent{rev: ev.Kv.ModRevision, key: key}
			if ev.Type != clientv3.EventTypeDelete {
				parseMarker(&e, string(ev.Kv.Value))
			}
			evs = append(evs, e)
		}
		// Only the sentinel ends the history: a response's header is etcd's
		// current revision, and a watch from an old revision replays in
		// batches (1,000 revisions each), so ending at the first header past
		// the sentinel checked only the first batch.
		if done {
			break
		}
	}
	revs, most, err = replayMarkers(evs, limit)
	if err != nil {
		t.Fatal(err)
	}
	ts, err := checkTokens(evs)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("tokens: %d holds, %d keys, %d local handoffs or joins; %d holds (%d exclusive) had a token lower than a hold of another key that had ended before they began (allowed for shared holds and permits: per-key tokens)",
		ts.holds, ts.keys, ts.handedOn, ts.lowerThanEnded, ts.exclusiveLower)
	if ts.holds == 0 {
		t.Fatal("no hold recorded its token: the token check proved nothing")
	}
	return revs, most
}

// tokenHold is one hold in the markers' history: its marker was put at
// start and deleted (by its holder, or with its lease) at end.
type tokenHold struct {
	start, end int64 // end: math.MaxInt64 while it lasts
	token      int64
	keyRev     int64
	kind       string
	lockKey    string
}

// tokenStats are what checkTokens counted.
type tokenStats struct {
	holds, keys, handedOn int
	lowerThanEnded        int // holds with a token below one of a hold ended before they began
	exclusiveLower        int // of which exclusive (a violation)
}

// checkTokens checks the fencing tokens of the holds in a markers' history
// (events in revision order) against what docs/locks.md promises, and
// returns the first violation:
//
//   - a token is its key's create revision << 16 | n, the key created no
//     later than its hold began, and no two holds share a token;
//   - per key of a permit or an exclusive lock (one holder at a time): a
//     hold that began after another of the same key ended has the larger
//     token (what a store that keeps the highest token per
//     STOCKCTL_LOCK_KEY relies on); readers joined to one shared key hold
//     together, and markers cannot tell the order of their joins;
//   - per name: a hold's token is larger than that of every hold that had
//     ended before its key was created;
//   - an exclusive hold's token is larger than that of every hold, of any
//     kind and key, that had ended before it began.
//
// A shared hold or a permit handed a key on locally may get a token below
// that of a hold of a younger key that ended before it began: counted (by
// marker order, which for readers is approximate), not a violation.
func checkTokens(evs []markerEvent) (st tokenStats, err error) {
	open := map[string]*tokenHold{}
	var holds []*tokenHold
	for _, e := range evs {
		if e.kind == "" {
			if h := open[e.key]; h != nil {
				h.end = e.rev
				delete(open, e.key)
			}
			continue
		}
		if e.token == 0 {
			continue
		}
		h := &tokenHold{start: e.rev, end: math.MaxInt64, token: e.token, keyRev: e.keyRev, kind: e.kind, lockKey: e.lockKey}
		open[e.key] = h
		holds = append(holds, h)
	}
	st.holds = len(holds)
	seen := map[int64]*tokenHold{}
	byKey := map[string][]*tokenHold{}
	for _, h := range holds {
		if o := seen[h.token]; o != nil {
			return st, fmt.Errorf("token %d given to two holds (key %s at revision %d, key %s at %d)", h.token, o.lockKey, o.start, h.lockKey, h.start)
		}
		seen[h.token] = h
		if h.token>>16 != h.keyRev || h.keyRev <= 0 || h.keyRev >= h.start {
			return st, fmt.Errorf("token %d of a hold of %s (created at revision %d) that began at revision %d: not its key's revision << 16 | n, or the key is not older than the hold", h.token, h.lockKey, h.keyRev, h.start)
		}
		byKey[h.lockKey] = append(byKey[h.lockKey], h)
	}
	st.keys = len(byKey)
	for key, hs := range byKey {
		st.handedOn += len(hs) - 1
		if hs[0].kind == markShared {
			// Readers that joined one key hold it together: a marker is put
			// after its hold began and deleted before it ended, so a reader
			// whose marker came after another's went may have joined first.
			continue
		}
		// One holder at a time: marker order is hold order.
		for _, b := range hs {
			for _, a := range hs {
				if a.end < b.start && a.token >= b.token {
					return st, fmt.Errorf("key %s: token %d (revision %d) after a hold with token %d that ended at revision %d", key, b.token, b.start, a.token, a.end)
				}
			}
		}
	}
	// The highest token of the holds ended by each revision.
	ended := slices.Clone(holds)
	slices.SortFunc(ended, func(a, b *tokenHold) int { return cmp.Compare(a.end, b.end) })
	best := make([]*tokenHold, len(ended)) // best[i]: the highest token of ended[:i+1]
	for i, h := range ended {
		best[i] = h
		if i > 0 && best[i-1].token > h.token {
			best[i] = best[i-1]
		}
	}
	highestEndedBefore := func(rev int64) *tokenHold {
		i, _ := slices.BinarySearchFunc(ended, rev, func(h *tokenHold, rev int64) int { return cmp.Compare(h.end, rev) })
		if i == 0 {
			return nil
		}
		return best[i-1]
	}
	for _, b := range holds {
		if a := highestEndedBefore(b.keyRev); a != nil && a.token >= b.token {
			return st, fmt.Errorf("token %d of a hold of %s: a hold of %s with token %d had ended at revision %d, before the key was created", b.token, b.lockKey, a.lockKey, a.token, a.end)
		}
		if a := highestEndedBefore(b.start); a != nil && a.token >= b.token {
			st.lowerThanEnded++
			if b.kind == markExclusive {
				st.exclusiveLower++
				return st, fmt.Errorf("exclusive hold of %s with token %d at revision %d: a hold of %s with token %d had ended at revision %d", b.lockKey, b.token, b.start, a.lockKey, a.token, a.end)
			}
		}
	}
	return st, nil
}

// replayMarkers replays marker events (in revision order) and returns an
// error at the first revision with more than limit markers (limit > 0), or
// with an exclusive marker beside another (limit 0).
func replayMarkers(evs []markerEvent, limit int) (revs, most int, err error) {
	live := map[string]string{}
	check := func(rev int64) error {
		revs++
		most = max(most, len(live))
		x := 0
		for _, k := range live {
			if k == markExclusive {
				x++
			}
		}
		switch {
		case limit > 0 && len(live) > limit:
			return fmt.Errorf("revision %d: %d holders of a semaphore of limit %d: %v", rev, len(live), limit, live)
		case limit == 0 && x > 0 && len(live) > 1:
			return fmt.Errorf("revision %d: an exclusive holder beside others: %v", rev, live)
		}
		return nil
	}
	for i, e := range evs {
		if e.kind == "" {
			delete(live, e.key)
		} else {
			live[e.key] = e.kind
		}
		if i == len(evs)-1 || evs[i+1].rev != e.rev { // a revision's last event
			if err := check(e.rev); err != nil {
				return revs, most, err
			}
		}
	}
	return revs, most, nil
}

// The checker itself: it accepts what the rules allow and catches each
// violation, including one that lasts a single revision and one hidden in
// a revision that also deletes.
func TestReplayMarkers(t *testing.T) {
	ev := func(rev int64, key, kind string) markerEvent { return markerEvent{rev: rev, key: key, kind: kind} }
	for _, tc := range []struct {
		name  string
		evs   []markerEvent
		limit int
		bad   bool
	}{
		{"readers together", []markerEvent{ev(1, "a", "s"), ev(2, "b", "s"), ev(3, "a", ""), ev(4, "b", "")}, 0, false},
		{"writer after readers", []markerEvent{ev(1, "a", "s"), ev(2, "a", ""), ev(3, "w", "x"), ev(4, "w", "")}, 0, false},
		{"writer beside a reader", []markerEvent{ev(1, "a", "s"), ev(2, "w", "x"), ev(3, "a", "")}, 0, true},
		{"two writers", []markerEvent{ev(1, "v", "x"), ev(2, "w", "x"), ev(2, "v", "")}, 0, false},
		{"two writers for one revision", []markerEvent{ev(1, "v", "x"), ev(2, "w", "x"), ev(3, "v", "")}, 0, true},
		{"a lease's end then a writer", []markerEvent{ev(1, "a", "s"), ev(1, "b", "s"), ev(2, "a", ""), ev(2, "b", ""), ev(3, "w", "x")}, 0, false},
		{"limit reached", []markerEvent{ev(1, "a", "p"), ev(2, "b", "p"), ev(3, "a", ""), ev(4, "c", "p")}, 2, false},
		{"limit exceeded", []markerEvent{ev(1, "a", "p"), ev(2, "b", "p"), ev(3, "c", "p"), ev(4, "a", "")}, 2, true},
	} {
		_, _, err := replayMarkers(tc.evs, tc.limit)
		if (err != nil) != tc.bad {
			t.Errorf("%s: %v, want a violation: %v", tc.name, err, tc.bad)
		}
	}
}

// The token checker: it accepts what docs/locks.md allows (a permit handed
// on locally with a token below a younger key's hold that ended before it)
// and catches each broken promise.
func TestCheckTokens(t *testing.T) {
	tok := func(rev, n int64) int64 { return rev<<16 | n }
	put := func(rev int64, marker, kind string, token int64, key string) markerEvent {
		return markerEvent{rev: rev, key: marker, kind: kind, token: token, keyRev: token >> 16, lockKey: key}
	}
	del := func(rev int64, marker string) markerEvent { return markerEvent{rev: rev, key: marker} }
	for _, tc := range []struct {
		name string
		evs  []markerEvent
		bad  bool
	}{
		{"exclusive handoffs then a new key", []markerEvent{
			put(2, "a", "x", tok(1, 0), "k1"), del(3, "a"), put(4, "b", "x", tok(1, 1), "k1"), del(5, "b"),
			put(7, "c", "x", tok(6, 0), "k6"), del(8, "c")}, false},
		{"permit handed on below a younger key's ended permit", []markerEvent{
			put(2, "a", "p", tok(1, 0), "k1"), put(4, "b", "p", tok(3, 0), "k3"), del(5, "b"),
			del(6, "a"), put(7, "c", "p", tok(1, 1), "k1"), del(8, "c")}, false},
		{"exclusive below an ended hold", []markerEvent{
			put(2, "a", "p", tok(1, 5), "k1"), del(3, "a"), put(5, "b", "x", tok(1, 4), "k1x"), del(6, "b")}, true},
		{"per key going backwards", []markerEvent{
			put(2, "a", "p", tok(1, 3), "k1"), del(3, "a"), put(4, "b", "p", tok(1, 2), "k1"), del(5, "b")}, true},
		{"a key younger than an ended hold, token lower", []markerEvent{
			put(2, "a", "s", tok(1, 9), "k1"), del(3, "a"),
			{rev: 5, key: "b", kind: "s", token: tok(1, 8), keyRev: 4, lockKey: "k4"}, del(6, "b")}, true},
		{"one token twice", []markerEvent{
			put(2, "a", "p", tok(1, 0), "k1"), put(3, "b", "p", tok(1, 0), "k1")}, true},
		{"a key not older than its hold", []markerEvent{put(2, "a", "p", tok(2, 0), "k2")}, true},
		{"shared joins overlapping", []markerEvent{
			put(2, "a", "s", tok(1, 1), "k1"), put(3, "b", "s", tok(1, 0), "k1"), del(4, "a"), del(5, "b")}, false},
		{"a reader's marker after a later join's went", []markerEvent{
			put(2, "a", "s", tok(1, 1), "k1"), del(3, "a"), put(4, "b", "s", tok(1, 0), "k1"), del(5, "b")}, false},
	} {
		_, err := checkTokens(tc.evs)
		if (err != nil) != tc.bad {
			t.Errorf("%s: %v, want a violation: %v", tc.name, err, tc.bad)
		}
	}
}

// Read-mostly load on one read-write lock from three processes, while a
// fourth, holding it exclusively, is frozen past its TTL (its traffic
// blackholed) until the others have taken the lock many times, then wakes:
// its fenced writes are rejected, its hold reads lost, and at no revision
// did an exclusive holder share the lock.
func TestRWHistoryPausedHolder(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	proxy := etcdtest.NewProxy(t, etcd.Endpoints()[0])
	opts := []coordinator.Option{coordinator.WithSessionTTL(ttl), coordinator.WithReleaseTimeout(200 * time.Millisecond)}
	victim := newCoord(t, []string{proxy.Endpoint()}, opts...)
	cs := []*coordinator.Coordinator{newCoord(t, etcd.Endpoints(), opts...), newCoord(t, etcd.Endpoints(), opts...), newCoord(t, etcd.Endpoints(), opts...)}
	ctx, cancel := etcdtest.HangContext(t)
	defer cancel()
	const name, markers = "hist-rw", "/e2e/hist-rw/"
	start, err := victim.Client().Get(ctx, "/e2e/start")
	if err != nil {
		t.Fatal(err)
	}

	var stop atomic.Bool
	wait, holds := histLoad(ctx, t, cs, 4, 1_000_000, name, 0, 0.9, markers, &stop)
	defer wait()
	defer stop.Store(true)
	etcdtest.WaitFor(t, "the load to run", time.Minute, func() bool { return holds.Load() >= 20 })

	// The victim takes the lock and its marker, then freezes.
	frozen := make(chan *coordinator.Lock, 1)
	healed := make(chan struct{})
	checked := make(chan struct{}) // the hold's loss was looked at: it may unlock
	var rejected atomic.Int64
	go func() {
		_, err := holdMarked(ctx, victim, markExclusive, name, 0, markers+"victim", func(l *coordinator.Lock) {
			frozen <- l
			<-healed
			// Awake: the write it meant to make under the lock.
			if tr, err := l.Txn(ctx).Then(clientv3.OpPut(markers+"victim-late", "late")).Commit(); err == nil && !tr.Succeeded {
				rejected.Add(1)
			}
			// Not before the test has seen the loss: an Unlock ends the
			// hold too, with a cause of its own ("not held by this
			// handle"), and the check below would read that (1 run in 20).
			<-checked
		})
		if err != nil && !errors.Is(err, coordinator.ErrLockLost) && !errors.Is(err, coordinator.ErrSessionLost) {
			t.Error("victim:", err)
		}
	}()
	l := <-frozen
	proxy.Blackhole()
	before := holds.Load()
	// Paused past its TTL: the others take the lock again and again.
	etcdtest.WaitFor(t, "the others to hold the lock after the victim's lease expired", time.Minute, func() bool { return holds.Load() >= before+30 })
	proxy.Unblackhole()
	close(healed)
	select {
	case <-l.Done():
	case <-time.After(time.Minute):
		t.Fatal("the paused holder was never told it lost the lock")
	}
	err = l.Err()
	close(checked)
	if !errors.Is(err, coordinator.ErrLockLost) {
		t.Fatalf("paused holder's Err = %v", err)
	}
	etcdtest.WaitFor(t, "the victim's late write", time.Minute, func() bool { return rejected.Load() == 1 })
	stop.Store(true)
	wait()
	revs, most := checkMarkers(t, etcd.Client(t), markers, start.Header.Revision+1, 0)
	t.Logf("%d holds, %d revisions checked, at most %d holders at once; the paused holder's late write was rejected", holds.Load(), revs, most)
	if most < 2 {
		t.Fatalf("never more than %d holder at once: the load did not share the lock", most)
	}
}

// A separate OS process holds two permits of a semaphore of limit 3
// (markers under its lease) while two processes of the test churn; it is
// SIGKILLed. Its permits come back after its TTL (the survivors hold 3 at
// once), and at no revision did more than 3 hold.
func TestSemaphoreHistoryKilledHolder(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	opts := []coordinator.Option{coordinator.WithSessionTTL(ttl)}
	cs := []*coordinator.Coordinator{newCoord(t, etcd.Endpoints(), opts...), newCoord(t, etcd.Endpoints(), opts...)}
	raw := etcd.Client(t)
	ctx, cancel := etcdtest.HangContext(t)
	defer cancel()
	const name, markers, limit = "hist-sem", "/e2e/hist-sem/", 3
	start, err := raw.Get(ctx, "/e2e/start")
	if err != nil {
		t.Fatal(err)
	}
	helper := startHelper(t, helperConfig{Mode: "permit", Endpoints: etcd.Endpoints(), TTLSec: int(ttl / time.Second),
		Sem: name, Limit: limit, Permits: 2, Markers: markers + "helper-"})
	etcdtest.WaitFor(t, "the helper to hold its permits", time.Minute, func() bool { return helper.count("HOLD ") == 2 })

	var stop atomic.Bool
	// Holders go on until stopped (bounded by ctx): with a fixed count they
	// could all be done before the killed helper's lease expires, and no
	// three would ever hold at once.
	wait, holds := histLoad(ctx, t, cs, 3, 1_000_000, name, limit, 0, markers, &stop)
	defer wait()
	defer stop.Store(true)
	etcdtest.WaitFor(t, "the survivors to share the one free permit", time.Minute, func() bool { return holds.Load() >= 20 })
	killedAt := helper.kill(t)
	// The killed process's permits come back after its TTL: the survivors
	// hold all three at once.
	var three atomic.Bool
	etcdtest.WaitFor(t, "three survivors holding at once", time.Minute, func() bool {
		resp, err := raw.Get(ctx, markers, clientv3.WithPrefix(), clientv3.WithKeysOnly())
		if err != nil {
			return false
		}
		n := 0
		for _, kv := range resp.Kvs {
			if !strings.HasPrefix(string(kv.Key), markers+"helper-") {
				n++
			}
		}
		if n == limit {
			three.Store(true)
		}
		return three.Load()
	})
	t.Logf("permits back %v after the SIGKILL (TTL %v)", time.Since(killedAt).Round(time.Millisecond), ttl)
	stop.Store(true)
	wait()
	revs, most := checkMarkers(t, raw, markers, start.Header.Revision+1, limit)
	t.Logf("%d holds, %d revisions checked, at most %d holders at once (limit %d)", holds.Load(), revs, most, limit)
}

// A client holding a shared lock is cut off from etcd (a blackholed proxy)
// while writers and readers go on. Its hold is lost (Done, ErrLockLost) and
// its fenced writes are rejected; after the partition heals it takes the
// lock again on a new session; at no revision was a writer not alone.
func TestRWHistoryPartition(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	proxy := etcdtest.NewProxy(t, etcd.Endpoints()[0])
	opts := []coordinator.Option{coordinator.WithSessionTTL(ttl), coordinator.WithReleaseTimeout(200 * time.Millisecond)}
	cut := newCoord(t, []string{proxy.Endpoint()}, opts...)
	cs := []*coordinator.Coordinator{newCoord(t, etcd.Endpoints(), opts...), newCoord(t, etcd.Endpoints(), opts...)}
	raw := etcd.Client(t)
	ctx, cancel := etcdtest.HangContext(t)
	defer cancel()
	const name, markers = "hist-part", "/e2e/hist-part/"
	start, err := raw.Get(ctx, "/e2e/start")
	if err != nil {
		t.Fatal(err)
	}

	l, err := cut.RLock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if tr, err := l.Txn(ctx).Then(clientv3.OpPut(markers+"cut", markShared, clientv3.WithLease(l.Lease()))).Commit(); err != nil || !tr.Succeeded {
		t.Fatalf("the cut client's marker: %v", err)
	}
	var stop atomic.Bool
	wait, holds := histLoad(ctx, t, cs, 3, 1_000_000, name, 0, 0.5, markers, &stop)
	defer wait()
	defer stop.Store(true)
	proxy.Blackhole()
	select {
	case <-l.Done():
	case <-time.After(time.Minute):
		t.Fatal("the cut-off holder was never told it lost the lock")
	}
	if !errors.Is(l.Err(), coordinator.ErrLockLost) {
		t.Fatalf("Err = %v, want ErrLockLost", l.Err())
	}
	before := holds.Load()
	etcdtest.WaitFor(t, "writers and readers to go on", time.Minute, func() bool { return holds.Load() >= before+20 })
	proxy.Unblackhole()
	if tr, err := l.Txn(ctx).Then(clientv3.OpPut(markers+"cut-late", "late")).Commit(); err == nil && tr.Succeeded {
		t.Fatal("a fenced write of the lost hold was applied after the partition healed")
	}
	retry(t, "lock again after the partition", time.Minute, anyErr, func(ctx context.Context) error {
		_, err := holdMarked(ctx, cut, markExclusive, name, 0, markers+"cut-again", nil)
		return err
	})
	stop.Store(true)
	wait()
	revs, most := checkMarkers(t, raw, markers, start.Header.Revision+1, 0)
	t.Logf("%d holds, %d revisions checked, at most %d holders at once", holds.Load(), revs, most)
}

// helperPermit holds cfg.Permits permits of cfg.Sem, each with its marker,
// until killed.
func helperPermit(ctx context.Context, c *coordinator.Coordinator, cfg helperConfig, out *lineWriter) {
	var wg sync.WaitGroup
	for i := range cfg.Permits {
		wg.Go(func() {
			marker := fmt.Sprintf("%s%d", cfg.Markers, i)
			_, err := holdMarked(ctx, c, markPermit, cfg.Sem, cfg.Limit, marker, func(*coordinator.Lock) {
				out.printf("HOLD %s", marker)
				<-ctx.Done() // only the kill ends it
			})
			fmt.Fprintln(os.Stderr, "helper: permit ended:", err)
		})
	}
	wg.Wait()
}
