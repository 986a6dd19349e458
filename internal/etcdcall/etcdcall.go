package etcdcall

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Budget returns a copy of parent that ends with cause once d has passed
// (or when parent ends, with parent's cause). Unlike context.WithTimeout it
// has no deadline of its own, so the calls made under it carry at most
// parent's deadline to the server, and the budget's end is always seen as
// a cancellation whose cause is cause. Call cancel to release its timer.
func Budget(parent context.Context, d time.Duration, cause error) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(parent)
	t := time.AfterFunc(d, func() { cancel(cause) })
	return ctx, func() {
		t.Stop()
		cancel(context.Canceled)
	}
}

// expirySlack is how close to its deadline a ctx must be for a server's
// timeout answer to count as the ctx's own end. gRPC rounds the timeout it
// sends up, and the server starts counting when the request arrives, so the
// server's expiry comes after the client's deadline; the slack only absorbs
// clock granularity.
const expirySlack = 50 * time.Millisecond

// Err returns err as the caller of a call made under ctx should see it:
// when err reports the end of the call's ctx (the client's cancellation, or
// a server's own "deadline exceeded" or "request timed out" answer at or
// after ctx's deadline), it returns ctx's cause, so that errors.Is(err,
// context.DeadlineExceeded) and errors.Is(err, cause) hold. Any other error
// is returned unchanged.
func Err(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if ctx.Err() != nil && endsCall(err) {
		return CauseOf(ctx)
	}
	if !serverExpiry(err) {
		return err
	}
	deadline, ok := ctx.Deadline()
	if !ok || time.Until(deadline) > expirySlack {
		return err // the server timed out on its own (e.g. no quorum)
	}
	// The deadline has passed; the ctx's timer is due and marks it done at
	// once. Wait for that, so the error carries the ctx's cause.
	t := time.NewTimer(time.Until(deadline) + expirySlack)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return CauseOf(ctx)
	case <-t.C:
		return fmt.Errorf("%w (%w)", context.DeadlineExceeded, err)
	}
}

// CauseOf is the error that says why ctx ended: its cause, wrapping
// ctx.Err() too when the cause is another error (so that both
// errors.Is(err, context.DeadlineExceeded) and errors.Is(err, cause)
// hold). It is nil while ctx is live.
func CauseOf(ctx context.Context) error {
	err := ctx.Err()
	if err == nil {
		return nil
	}
	cause := context.Cause(ctx)
	if cause == nil || cause == err || errors.Is(cause, err) {
		return cause
	}
	return fmt.Errorf("%w (%w)", cause, err)
}

// endsCall reports whether err is how a call reports that its ctx ended.
func endsCall(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || serverExpiry(err) {
		return true
	}
	s, ok := status.FromError(err)
	return ok && (s.Code() == codes.Canceled || s.Code() == codes.DeadlineExceeded)
}

// serverExpiry reports whether err is a server's answer that the time
// allowed for the call ran out on its side: gRPC's DeadlineExceeded, the
// text of Go's context errors under code Unknown (etcd 3.4 returns ctx.Err()
// from its handlers, which gRPC sends as Unknown), or etcd's own timeouts
// (a proposal whose ctx expired).
func serverExpiry(err error) bool {
	if errors.Is(err, rpctypes.ErrTimeout) || errors.Is(err, rpctypes.ErrTimeoutDueToLeaderFail) ||
		errors.Is(err, rpctypes.ErrTimeoutDueToConnectionLost) {
		return true
	}
	s, ok := status.FromError(err)
	if !ok {
		return false
	}
	switch s.Code() {
	case codes.DeadlineExceeded:
		return true
	case codes.Unknown, codes.Unavailable:
		msg := s.Message()
		return msg == context.DeadlineExceeded.Error() || msg == context.Canceled.Error() ||
			strings.HasPrefix(msg, "etcdserver: request timed out")
	}
	return false
}

// Run calls f with a copy of ctx that has no deadline and is cancelled when
// ctx ends, and returns f's error through Err: for etcd calls other than
// KV's (a lease grant, say).
func Run(ctx context.Context, f func(ctx context.Context) error) error {
	dctx, stop := detach(ctx)
	defer stop()
	return Err(ctx, f(dctx))
}

// detach returns a copy of ctx without its deadline that is cancelled, with
// ctx's cause, when ctx ends; release it with stop.
func detach(ctx context.Context) (context.Context, func()) {
	if _, ok := ctx.Deadline(); !ok {
		return ctx, func() {}
	}
	dctx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	stopAfter := context.AfterFunc(ctx, func() { cancel(context.Cause(ctx)) })
	return dctx, func() {
		stopAfter()
		cancel(context.Canceled)
	}
}

// KV wraps kv so that no call sends its caller's deadline to the server (the
// call is cancelled when the caller's ctx ends instead) and every error goes
// through Err.
func KV(kv clientv3.KV) clientv3.KV { return wrappedKV{kv} }

type wrappedKV struct{ kv clientv3.KV }

func (w wrappedKV) Put(ctx context.Context, key, val string, opts ...clientv3.OpOption) (*clientv3.PutResponse, error) {
	dctx, stop := detach(ctx)
	defer stop()
	resp, err := w.kv.Put(dctx, key, val, opts...)
	return resp, Err(ctx, err)
}

func (w wrappedKV) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	dctx, stop := detach(ctx)
	defer stop()
	resp, err := w.kv.Get(dctx, key, opts...)
	return resp, Err(ctx, err)
}

// GetStream is passed through: its stream outlives the call, so the
// caller's ctx (deadline included) bounds it as given.
func (w wrappedKV) GetStream(ctx context.Context, key string, opts ...clientv3.OpOption) (clientv3.GetStreamChan, error) {
	ch, err := w.kv.GetStream(ctx, key, opts...)
	return ch, Err(ctx, err)
}

func (w wrappedKV) Delete(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.DeleteResponse, error) {
	dctx, stop := detach(ctx)
	defer stop()
	resp, err := w.kv.Delete(dctx, key, opts...)
	return resp, Err(ctx, err)
}

func (w wrappedKV) Compact(ctx context.Context, rev int64, opts ...clientv3.CompactOption) (*clientv3.CompactResponse, error) {
	dctx, stop := detach(ctx)
	defer stop()
	resp, err := w.kv.Compact(dctx, rev, opts...)
	return resp, Err(ctx, err)
}

func (w wrappedKV) Do(ctx context.Context, op clientv3.Op) (clientv3.OpResponse, error) {
	dctx, stop := detach(ctx)
	defer stop()
	resp, err := w.kv.Do(dctx, op)
	return resp, Err(ctx, err)
}

func (w wrappedKV) Txn(ctx context.Context) clientv3.Txn { return &txn{kv: w.kv, ctx: ctx} }

// txn records a transaction and builds the client's at Commit, under the
// detached ctx. The client's Txn checks the order of If, Then and Else; the
// recorded calls are replayed in the order they were made, so it still does.
type txn struct {
	kv    clientv3.KV
	ctx   context.Context
	steps []func(clientv3.Txn) clientv3.Txn
}

func (t *txn) If(cs ...clientv3.Cmp) clientv3.Txn {
	t.steps = append(t.steps, func(x clientv3.Txn) clientv3.Txn { return x.If(cs...) })
	return t
}

func (t *txn) Then(ops ...clientv3.Op) clientv3.Txn {
	t.steps = append(t.steps, func(x clientv3.Txn) clientv3.Txn { return x.Then(ops...) })
	return t
}

func (t *txn) Else(ops ...clientv3.Op) clientv3.Txn {
	t.steps = append(t.steps, func(x clientv3.Txn) clientv3.Txn { return x.Else(ops...) })
	return t
}

func (t *txn) Commit() (*clientv3.TxnResponse, error) {
	dctx, stop := detach(t.ctx)
	defer stop()
	x := t.kv.Txn(dctx)
	for _, step := range t.steps {
		x = step(x)
	}
	resp, err := x.Commit()
	return resp, Err(t.ctx, err)
}
