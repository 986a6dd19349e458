package service

import (
	"context"
	"fmt"
	"time"

	"connectrpc.com/connect"

	stockctlv1 "github.com/stockctl/stockctl/api/stockctl/v1"
)

// An Acquire's request_id: the caller's idempotency key, so that a hold
// granted to a call whose answer never arrived (its deadline passed on the
// caller's side first, the connection broke) can be found again (an
// Acquire with the same ID) or ended (Release with it).
const (
	minRequestIDLen = 16
	maxRequestIDLen = 128
)

func checkRequestID(id string) error {
	if len(id) < minRequestIDLen || len(id) > maxRequestIDLen {
		return badField("request_id", fmt.Sprintf("must be %d to %d bytes (a random ID: it is a capability, like hold_id), got %d",
			minRequestIDLen, maxRequestIDLen, len(id)))
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; c <= ' ' || c > '~' {
			return badField("request_id", fmt.Sprintf("must be printable ASCII other than space; byte %d is %#02x", i, c))
		}
	}
	return nil
}

// request is what a server knows of one request_id: the acquisition
// waiting under it, the hold it was granted, or that it was withdrawn.
// Guarded by holdTable.mu.
type request struct {
	id        string
	spec      lockSpec
	waiting   bool               // an Acquire is waiting for the lock under it
	cancel    context.CancelFunc // ends that wait (Release by request_id)
	done      chan struct{}      // closed when the wait ends
	ls        *lease             // the hold it was granted, live or ended
	withdrawn bool               // released before anything was granted
	ended     time.Time          // when it stopped being live or waiting: retention
}

func sameSpec(a, b lockSpec) bool {
	return a.name == b.name && a.kind == b.kind && a.limit == b.limit
}

// claim looks id up for an Acquire of spec. It returns the hold to answer
// again (replayed, its ttl renewed), or a new waiting request that the
// caller acquires for (and ends with granted or dropRequest), or an error.
// A request still waiting in another call is waited for, within ctx.
func (t *holdTable) claim(ctx context.Context, id string, spec lockSpec) (*lease, time.Time, *request, error) {
	for {
		t.mu.Lock()
		rq := t.requests[id]
		switch {
		case rq == nil:
			rq = &request{id: id, spec: spec, waiting: true, done: make(chan struct{})}
			t.requests[id] = rq
			t.mu.Unlock()
			return nil, time.Time{}, rq, nil
		case rq.withdrawn:
			t.mu.Unlock()
			return nil, time.Time{}, nil, withdrawnError(id)
		case !sameSpec(rq.spec, spec):
			t.mu.Unlock()
			return nil, time.Time{}, nil, badField("request_id", fmt.Sprintf("was used for %v %q (limit %d), not this request: a request_id names one acquisition",
				rq.spec.kind, rq.spec.name, rq.spec.limit))
		case rq.waiting:
			done := rq.done
			t.mu.Unlock()
			select {
			case <-done:
				continue
			case <-ctx.Done():
				return nil, time.Time{}, nil, context.Cause(ctx)
			}
		}
		ls := rq.ls
		if t.live[ls.id] != ls {
			e := t.ended[ls.id]
			t.mu.Unlock()
			return nil, time.Time{}, nil, endedError(ls.id, e, "acquire again")
		}
		ls.expires = time.Now().Add(ls.spec.ttl)
		expires := ls.expires
		t.mu.Unlock()
		return ls, expires, nil, nil
	}
}

func withdrawnError(id string) *connect.Error {
	return newError(connect.CodeNotFound, stockctlv1.ErrorReason_ERROR_REASON_HOLD_NOT_FOUND,
		fmt.Errorf("request_id %q was withdrawn by a Release: nothing is held under it; acquire with a new request_id", id), nil)
}

// setWait records the cancel of rq's wait, or calls it at once if rq was
// withdrawn meanwhile.
func (t *holdTable) setWait(rq *request, cancel context.CancelFunc) {
	t.mu.Lock()
	rq.cancel = cancel
	withdrawn := rq.withdrawn
	t.mu.Unlock()
	if withdrawn {
		cancel()
	}
}

// dropRequest ends rq's wait with nothing granted: the ID is free again
// (an Acquire with it acquires anew), unless it was withdrawn, which is
// remembered.
func (t *holdTable) dropRequest(rq *request) {
	if rq == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.endWait(rq)
	if rq.withdrawn {
		t.rememberRequest(rq)
	} else if t.requests[rq.id] == rq {
		delete(t.requests, rq.id)
	}
}

// endWait marks rq's wait over. Called under mu.
func (t *holdTable) endWait(rq *request) {
	if rq.waiting {
		rq.waiting = false
		close(rq.done)
	}
}

// rememberRequest keeps an ended or withdrawn request for the retention.
// Called under mu.
func (t *holdTable) rememberRequest(rq *request) {
	rq.ended = time.Now()
	t.reqOrder = append(t.reqOrder, rq)
	for len(t.reqOrder) > 0 {
		old := t.reqOrder[0]
		if len(t.reqOrder) <= t.s.cfg.MaxHolds && time.Since(old.ended) < t.s.cfg.HoldRetention {
			break
		}
		if t.requests[old.id] == old {
			delete(t.requests, old.id)
		}
		t.reqOrder = t.reqOrder[1:]
	}
}

// releaseRequest is Release by request_id: the hold granted under id is
// released as Release by its hold_id would; an acquisition that holds
// nothing (waiting, failed, or not arrived yet) is withdrawn.
func (t *holdTable) releaseRequest(id string) (name string, token int64, holdID string, withdrawn bool, err error) {
	t.mu.Lock()
	rq := t.requests[id]
	switch {
	case rq == nil:
		rq = &request{id: id, withdrawn: true}
		t.requests[id] = rq
		t.rememberRequest(rq)
		t.mu.Unlock()
		return "", 0, "", true, nil
	case rq.withdrawn:
		t.mu.Unlock()
		return rq.spec.name, 0, "", true, nil
	case rq.waiting:
		rq.withdrawn = true
		cancel := rq.cancel
		t.mu.Unlock()
		if cancel != nil {
			cancel()
		}
		return rq.spec.name, 0, "", true, nil
	}
	ls := rq.ls
	t.mu.Unlock()
	name, token, err = t.release(ls.id)
	if err != nil {
		t.mu.Lock()
		e := t.ended[ls.id]
		t.mu.Unlock()
		if e != nil && e.reason == stockctlv1.LostReason_LOST_REASON_CALLER_GONE {
			// Abandoned meanwhile: it was nobody's.
			return ls.spec.name, 0, "", true, nil
		}
	}
	return name, token, ls.id, false, err
}

// abandon ends ls, granted to a caller that went away before its answer
// was sent (CALLER_GONE): nobody knows of it. Its request_id, if any, is
// free again.
func (t *holdTable) abandon(ls *lease) {
	// The request_id first: a Release by it from now on withdraws it.
	if rq := ls.req; rq != nil {
		t.mu.Lock()
		if t.requests[rq.id] == rq {
			delete(t.requests, rq.id)
		}
		t.mu.Unlock()
	}
	if t.endLost(ls, stockctlv1.LostReason_LOST_REASON_CALLER_GONE,
		"the caller went away before the Acquire's answer was sent: nobody knew of the hold, so the server released it", nil) {
		t.s.log.Info("api: released a lock whose Acquire's caller went away before the answer", "lock", ls.spec.name, "token", ls.l.Token())
	}
}

// withdrawnNow reports whether rq was withdrawn (by Release) before its
// Acquire ended.
func (rq *request) withdrawnNow(t *holdTable) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return rq.withdrawn
}
