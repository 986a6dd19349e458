package etcdtest

import (
	"context"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Expiry34 makes an embedded member answer like an etcd 3.4 server whose
// deadline for a call ran out: every KV or lease-grant call that carries a
// deadline is answered, a little before that deadline, with the error a
// 3.4 server sends ("rpc error: code = Unknown desc = context deadline
// exceeded"), without being applied. The answer arrives before the client's
// own ctx is done, which is what happens against a real 3.4 server on a
// loaded machine (the client's timer fires late). Calls without a deadline
// are served normally.
type Expiry34 struct {
	// Lead is how long before the deadline the answer is sent.
	Lead time.Duration

	withDeadline atomic.Int64
	without      atomic.Int64
}

// NewExpiry34 returns an Expiry34 that answers lead before each deadline.
func NewExpiry34(lead time.Duration) *Expiry34 { return &Expiry34{Lead: lead} }

// Option is the member option that installs the interceptor.
func (e *Expiry34) Option() Option {
	return WithGRPCServerOptions(grpc.ChainUnaryInterceptor(e.intercept))
}

// WithDeadline and Without count the intercepted calls that carried a
// deadline (and were answered with the injected error) and those that did
// not (and were served).
func (e *Expiry34) WithDeadline() int64 { return e.withDeadline.Load() }
func (e *Expiry34) Without() int64      { return e.without.Load() }

func (e *Expiry34) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if !strings.HasPrefix(info.FullMethod, "/etcdserverpb.KV/") && info.FullMethod != "/etcdserverpb.Lease/LeaseGrant" {
		return handler(ctx, req)
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		e.without.Add(1)
		return handler(ctx, req)
	}
	e.withDeadline.Add(1)
	t := time.NewTimer(max(0, time.Until(deadline)-e.Lead))
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
	return nil, status.Error(codes.Unknown, context.DeadlineExceeded.Error())
}
