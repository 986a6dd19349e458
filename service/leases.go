package service

import (
	"crypto/rand"
	"errors"
	"fmt"
	"sync"
	"time"

	"connectrpc.com/connect"

	stockctlv1 "github.com/stockctl/stockctl/api/stockctl/v1"
	"github.com/stockctl/stockctl/coordinator"
)

// Shapes of hold, the label of stockctl_api_lock_holds.
const (
	shapeStream = "stream"
	shapeLease  = "lease"
)

// holdTable keeps the unary holds of a server (LockService.Acquire,
// KeepAlive, Release): the live ones, each kept by a goroutine that ends it
// when its ttl passes without a KeepAlive or its lock is lost, and, for
// Config.HoldRetention, the ones that ended, so that a late KeepAlive or
// Release learns how.
//
// Exactly one party ends a hold: whoever moves it from live to ended under
// mu (finish) also unlocks it. The keeper goroutine, Release, KeepAlive
// (finding the lock lost) and closeAll race for that; the losers do
// nothing.
type holdTable struct {
	s *Server

	mu      sync.Mutex
	live    map[string]*lease
	ended   map[string]*endedHold
	order   []string // ended IDs, oldest first, for eviction
	pending int      // Acquire calls waiting for their lock, counted against MaxHolds
	closed  bool

	requests map[string]*request // by request_id: waiting, granted (live or ended), withdrawn
	reqOrder []*request          // ended and withdrawn requests, oldest first, for eviction
}

// lease is one live unary hold.
type lease struct {
	id      string
	spec    lockSpec
	l       *coordinator.Lock
	expires time.Time     // guarded by holdTable.mu
	stop    chan struct{} // closed by finish: the keeper goroutine returns
	req     *request      // the request_id it was granted under, if any
}

// endedHold is how a hold ended.
type endedHold struct {
	name     string
	token    int64
	released bool // by Release; else lost for reason
	reason   stockctlv1.LostReason
	msg      string
	at       time.Time
}

func newHoldTable(s *Server) *holdTable {
	return &holdTable{s: s, live: map[string]*lease{}, ended: map[string]*endedHold{}, requests: map[string]*request{}}
}

// reserve counts an Acquire against MaxHolds before it waits for its lock.
// Each successful reserve is followed by add or unreserve.
func (t *holdTable) reserve() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return errShuttingDown
	}
	if len(t.live)+t.pending >= t.s.cfg.MaxHolds {
		return newError(connect.CodeResourceExhausted, stockctlv1.ErrorReason_ERROR_REASON_TOO_MANY_HOLDS,
			fmt.Errorf("this server keeps at most %d unary lock holds: release some, or use LockService.Hold", t.s.cfg.MaxHolds), nil)
	}
	t.pending++
	return nil
}

func (t *holdTable) unreserve() {
	t.mu.Lock()
	t.pending--
	t.mu.Unlock()
}

// add registers a lock just acquired for a reserved Acquire (under rq, if
// the call named a request_id) and starts keeping it.
func (t *holdTable) add(spec lockSpec, l *coordinator.Lock, rq *request) (*lease, time.Time, error) {
	ls := &lease{id: "h_" + rand.Text(), spec: spec, l: l, stop: make(chan struct{}), req: rq}
	t.mu.Lock()
	t.pending--
	if t.closed || (rq != nil && rq.withdrawn) {
		err := errShuttingDown
		if rq != nil {
			t.endWait(rq)
			if rq.withdrawn {
				err = withdrawnError(rq.id)
				t.rememberRequest(rq)
			} else if t.requests[rq.id] == rq {
				delete(t.requests, rq.id)
			}
		}
		t.mu.Unlock()
		_ = t.s.unlock(l)
		return nil, time.Time{}, err
	}
	if rq != nil {
		rq.ls = ls
		t.endWait(rq)
	}
	ls.expires = time.Now().Add(spec.ttl)
	expires := ls.expires
	t.live[ls.id] = ls
	t.s.bg.Add(1)
	t.mu.Unlock()
	t.s.metrics.holds.WithLabelValues(shapeLease).Inc()
	go t.keep(ls)
	return ls, expires, nil
}

// keep ends ls when its ttl passes without a KeepAlive, or when its lock
// is lost; it returns early when someone else ended it.
func (t *holdTable) keep(ls *lease) {
	defer t.s.bg.Done()
	timer := time.NewTimer(ls.spec.ttl)
	defer timer.Stop()
	for {
		select {
		case <-ls.stop:
			return
		case <-ls.l.Done():
			reason, msg := lostReason(ls.l)
			t.endLost(ls, reason, msg, nil)
			return
		case <-timer.C:
			var left time.Duration
			expired := func() bool {
				left = time.Until(ls.expires)
				return left <= 0
			}
			if t.endLost(ls, stockctlv1.LostReason_LOST_REASON_KEEPALIVE_TIMEOUT,
				fmt.Sprintf("no KeepAlive for its ttl of %v: the server released it", ls.spec.ttl), expired) {
				return
			}
			if left <= 0 { // ended by someone else meanwhile
				return
			}
			timer.Reset(left)
		}
	}
}

// finish moves ls from live to ended as e, if ls is still live and cond
// (called under mu; nil: true) holds. It reports whether it did: the
// caller then owns the unlock.
func (t *holdTable) finish(ls *lease, e *endedHold, cond func() bool) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.live[ls.id] != ls || (cond != nil && !cond()) {
		return false
	}
	delete(t.live, ls.id)
	close(ls.stop)
	e.name, e.token, e.at = ls.spec.name, ls.l.Token(), time.Now()
	t.remember(ls.id, e)
	if ls.req != nil {
		t.rememberRequest(ls.req)
	}
	t.s.metrics.holds.WithLabelValues(shapeLease).Dec()
	return true
}

// endLost ends ls as lost for reason, if cond allows, and unlocks it.
func (t *holdTable) endLost(ls *lease, reason stockctlv1.LostReason, msg string, cond func() bool) bool {
	if !t.finish(ls, &endedHold{reason: reason, msg: msg}, cond) {
		return false
	}
	_ = t.s.unlock(ls.l)
	t.s.log.Info("api: lock hold ended", "lock", ls.spec.name, "token", ls.l.Token(), "reason", reason.String())
	return true
}

// remember keeps e for the retention, evicting the oldest beyond it or
// beyond MaxHolds. Called under mu.
func (t *holdTable) remember(id string, e *endedHold) {
	t.ended[id] = e
	t.order = append(t.order, id)
	for len(t.order) > 0 {
		old := t.ended[t.order[0]]
		if old != nil && len(t.order) <= t.s.cfg.MaxHolds && time.Since(old.at) < t.s.cfg.HoldRetention {
			break
		}
		delete(t.ended, t.order[0])
		t.order = t.order[1:]
	}
}

// lookup returns the live hold id or how it ended (nil, nil: unknown).
// Called under mu.
func (t *holdTable) lookup(id string) (*lease, *endedHold) {
	if ls := t.live[id]; ls != nil {
		return ls, nil
	}
	if e := t.ended[id]; e != nil && time.Since(e.at) < t.s.cfg.HoldRetention {
		return nil, e
	}
	return nil, nil
}

// keepAlive extends a live hold by its ttl and returns it with its new
// expiry time.
func (t *holdTable) keepAlive(id string) (*lease, time.Time, error) {
	t.mu.Lock()
	ls, e := t.lookup(id)
	if ls == nil {
		t.mu.Unlock()
		return nil, time.Time{}, endedError(id, e, "keep alive")
	}
	if ls.l.Err() != nil { // lost, and the keeper has not noticed yet
		t.mu.Unlock()
		reason, msg := lostReason(ls.l)
		t.endLost(ls, reason, msg, nil)
		return nil, time.Time{}, lockLost(ls.spec.name, ls.l.Token(), reason, msg)
	}
	if !time.Now().Before(ls.expires) {
		// Its ttl passed without a KeepAlive, and the keeper has not ended
		// it yet: a late KeepAlive does not revive it (the caller was told
		// the hold lasts its ttl; it may have stopped trusting it).
		t.mu.Unlock()
		msg := fmt.Sprintf("no KeepAlive for its ttl of %v: the server released it", ls.spec.ttl)
		t.endLost(ls, stockctlv1.LostReason_LOST_REASON_KEEPALIVE_TIMEOUT, msg, nil)
		return nil, time.Time{}, lockLost(ls.spec.name, ls.l.Token(), stockctlv1.LostReason_LOST_REASON_KEEPALIVE_TIMEOUT, msg)
	}
	ls.expires = time.Now().Add(ls.spec.ttl)
	expires := ls.expires
	t.mu.Unlock()
	return ls, expires, nil
}

// release ends a live hold by the caller's Release; released again, it
// answers the same.
func (t *holdTable) release(id string) (name string, token int64, err error) {
	t.mu.Lock()
	ls, e := t.lookup(id)
	t.mu.Unlock()
	if ls == nil {
		if e != nil && e.released {
			return e.name, e.token, nil
		}
		return "", 0, endedError(id, e, "release")
	}
	if !t.finish(ls, &endedHold{released: true}, nil) {
		return t.release(id) // ended meanwhile: answer as it ended
	}
	if err := t.s.unlock(ls.l); lost(err) {
		reason, msg := lostReason(ls.l)
		t.mu.Lock()
		if e := t.ended[id]; e != nil {
			e.released, e.reason, e.msg = false, reason, msg
		}
		t.mu.Unlock()
		return "", 0, lockLost(ls.spec.name, ls.l.Token(), reason, msg)
	}
	return ls.spec.name, ls.l.Token(), nil
}

// endedError is the error of a KeepAlive or Release of a hold that is not
// live: LOCK_LOST if it was lost, else HOLD_NOT_FOUND.
func endedError(id string, e *endedHold, what string) error {
	if e != nil && !e.released {
		return lockLost(e.name, e.token, e.reason, e.msg)
	}
	msg := fmt.Sprintf("%s: no live hold %q on this server (never acquired here, expired and forgotten, or held by another server)", what, id)
	if e != nil {
		msg = fmt.Sprintf("%s: hold %q of lock %q was released", what, id, e.name)
	}
	return newError(connect.CodeNotFound, stockctlv1.ErrorReason_ERROR_REASON_HOLD_NOT_FOUND, errors.New(msg), nil)
}

// closeAll ends every live hold (SERVER_SHUTDOWN) and refuses new ones.
// Releases run a few at a time, each bounded by the release timeout.
func (t *holdTable) closeAll() {
	t.mu.Lock()
	t.closed = true
	holds := make([]*lease, 0, len(t.live))
	for _, ls := range t.live {
		holds = append(holds, ls)
	}
	t.mu.Unlock()
	sem := make(chan struct{}, 16)
	var wg sync.WaitGroup
	for _, ls := range holds {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			t.endLost(ls, stockctlv1.LostReason_LOST_REASON_SERVER_SHUTDOWN, "the server shut down and released it", nil)
		})
	}
	wg.Wait()
}
