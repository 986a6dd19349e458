package service

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	stockctlv1 "github.com/stockctl/stockctl/api/stockctl/v1"
	"github.com/stockctl/stockctl/coordinator"
)

// MaxLockWait bounds a lock request's wait field.
const MaxLockWait = time.Hour

// lockSpec is a validated lock request, of either shape.
type lockSpec struct {
	name  string
	kind  stockctlv1.LockKind
	limit int // semaphores
	ttl   time.Duration
	// wait >= 0 is a coordinator.TryFor budget; wait < 0 waits as long as the call's
	// ctx allows.
	wait time.Duration
}

// parseLockSpec checks a lock request. Errors are the API's: invalid
// fields, or UNIMPLEMENTED for a kind this server does not know.
func parseLockSpec(name string, kind stockctlv1.LockKind, limit int32, ttl, wait *durationpb.Duration) (lockSpec, error) {
	switch kind {
	case stockctlv1.LockKind_LOCK_KIND_UNSPECIFIED:
		kind = stockctlv1.LockKind_LOCK_KIND_EXCLUSIVE
	case stockctlv1.LockKind_LOCK_KIND_EXCLUSIVE, stockctlv1.LockKind_LOCK_KIND_SHARED, stockctlv1.LockKind_LOCK_KIND_SEMAPHORE:
	default:
		return lockSpec{}, newError(connect.CodeUnimplemented, stockctlv1.ErrorReason_ERROR_REASON_LOCK_KIND_UNSUPPORTED,
			fmt.Errorf("lock kind %v is not supported by this server: only EXCLUSIVE, SHARED and SEMAPHORE", kind), map[string]string{"field": "kind"})
	}
	switch {
	case kind == stockctlv1.LockKind_LOCK_KIND_SEMAPHORE && (limit < 1 || limit > coordinator.MaxSemaphoreLimit):
		return lockSpec{}, badField("limit", fmt.Sprintf("a semaphore's limit must be 1 to %d, got %d", coordinator.MaxSemaphoreLimit, limit))
	case kind != stockctlv1.LockKind_LOCK_KIND_SEMAPHORE && limit != 0:
		return lockSpec{}, badField("limit", fmt.Sprintf("limit is for LOCK_KIND_SEMAPHORE only, got %d with %v", limit, kind))
	}
	if err := coordinator.ValidateLockName(name); err != nil {
		return lockSpec{}, badField("name", strings.TrimPrefix(err.Error(), coordinator.ErrInvalidArgument.Error()+": ")+" ("+lockNameRule+")")
	}
	t, err := boundedDuration("ttl", ttl, DefaultLockTTL, MinLockTTL, MaxLockTTL)
	if err != nil {
		return lockSpec{}, err
	}
	w := time.Duration(-1)
	if wait != nil {
		if w, err = boundedDuration("wait", wait, 0, 0, MaxLockWait); err != nil {
			return lockSpec{}, err
		}
	}
	return lockSpec{name: name, kind: kind, limit: int(limit), ttl: t, wait: w}, nil
}

var lockNameRule = fmt.Sprintf("a lock name is 1 to %d bytes of printable ASCII other than space and '/'", coordinator.MaxLockNameLen)

// acquire takes spec's lock for a remote caller. ctx bounds the wait. On
// success the caller must end the hold with s.unlock.
//
// Callers of one server share its coordinator, so its local queue orders
// them and a lock may pass from one to the next without going back to
// etcd (a cohort handoff, under the same etcd key): each hold still gets a
// token larger than every token before it on that key (coordinator.Lock.Token),
// so a caller that lost its hold cannot write with its successor's token.
func (s *Server) acquire(ctx context.Context, spec lockSpec) (*coordinator.Lock, error) {
	if err := s.etcdReady(ctx); err != nil {
		return nil, err
	}
	var opts []coordinator.AcquireOption
	if spec.wait >= 0 {
		opts = append(opts, coordinator.TryFor(spec.wait))
	}
	switch spec.kind {
	case stockctlv1.LockKind_LOCK_KIND_SHARED:
		return s.c.RLock(ctx, spec.name, opts...)
	case stockctlv1.LockKind_LOCK_KIND_SEMAPHORE:
		return s.c.AcquirePermit(ctx, spec.name, spec.limit, opts...)
	}
	return s.c.Lock(ctx, spec.name, opts...)
}

// unlock ends a hold taken by acquire, on a fresh bounded ctx: the
// caller's may be gone. It returns Unlock's error: ErrLockLost (or
// ErrClosed) when the hold had been lost. Any other failure to delete the
// key is retried by the coordinator in the background, and a later hold
// never reuses the key: its token is larger all the same.
func (s *Server) unlock(l *coordinator.Lock) error {
	ctx, cancel := context.WithTimeout(context.Background(), coordinator.DefaultReleaseTimeout)
	defer cancel()
	err := l.Unlock(ctx)
	if err != nil && !lost(err) {
		s.log.Warn("api: releasing a lock failed; the coordinator retries in the background", "lock", l.Name(), "err", err)
	}
	return err
}

// lost reports whether err says a hold was lost.
func lost(err error) bool {
	return errors.Is(err, coordinator.ErrLockLost) || errors.Is(err, coordinator.ErrClosed)
}

// lockLost is the LOCK_LOST error of a hold lost for reason.
func lockLost(name string, token int64, reason stockctlv1.LostReason, msg string) *connect.Error {
	return newError(connect.CodeFailedPrecondition, stockctlv1.ErrorReason_ERROR_REASON_LOCK_LOST,
		fmt.Errorf("lock %q (token %d) was lost: %s", name, token, msg),
		map[string]string{"name": name, "reason": reason.String()},
		&stockctlv1.LockLost{Name: name, Token: token, Reason: reason, Message: msg})
}

// lostReason says why the coordinator's lock l ended.
func lostReason(l *coordinator.Lock) (stockctlv1.LostReason, string) {
	if errors.Is(l.Err(), coordinator.ErrClosed) {
		return stockctlv1.LostReason_LOST_REASON_SERVER_SHUTDOWN, "the server's coordinator closed"
	}
	return stockctlv1.LostReason_LOST_REASON_SESSION_LOST, "the server's etcd session ended, or the hold's etcd key was deleted: another caller may hold the lock now"
}

// lockBusy adds the LockBusy detail to a LOCK_BUSY error.
func lockBusy(ce *connect.Error, spec lockSpec) *connect.Error {
	if ce.Code() == connect.CodeAborted {
		addDetail(ce, &stockctlv1.LockBusy{Name: spec.name, Wait: durationpb.New(max(0, spec.wait))})
	}
	return ce
}
