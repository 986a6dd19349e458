package etcdcall_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/stockctl/stockctl/internal/etcdcall"
	"github.com/stockctl/stockctl/internal/etcdtest"
)

var errBudget = errors.New("budget spent")

// The answers an etcd server can give when the time for a call ran out,
// classified by what the caller's ctx says.
func TestErr(t *testing.T) {
	unknownDeadline := status.Error(codes.Unknown, "context deadline exceeded") // etcd 3.4
	compacted := rpctypes.ErrCompacted
	for _, tc := range []struct {
		name string
		ctx  func() (context.Context, context.CancelFunc)
		err  error
		want []error // errors.Is targets the result must match
		same bool    // the result is err itself
	}{
		{"nil stays nil", noDeadline, nil, nil, false},
		{"3.4 deadline answer, deadline due", deadlineIn(20 * time.Millisecond), unknownDeadline, []error{context.DeadlineExceeded}, false},
		{"3.4 request timed out, deadline due", deadlineIn(20 * time.Millisecond), rpctypes.ErrTimeout, []error{context.DeadlineExceeded}, false},
		{"gRPC DeadlineExceeded, deadline due", deadlineIn(20 * time.Millisecond), status.Error(codes.DeadlineExceeded, "x"), []error{context.DeadlineExceeded}, false},
		{"3.4 deadline answer, deadline far", deadlineIn(time.Hour), unknownDeadline, nil, true},
		{"request timed out without a deadline (no quorum)", noDeadline, rpctypes.ErrTimeout, nil, true},
		{"another error when the deadline passed", expired, compacted, nil, true},
		{"cancelled with a cause", cancelledWith(errBudget), context.Canceled, []error{errBudget, context.Canceled}, false},
		{"timeout with a cause", timeoutCause(errBudget), unknownDeadline, []error{errBudget, context.DeadlineExceeded}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := tc.ctx()
			defer cancel()
			got := etcdcall.Err(ctx, tc.err)
			if tc.err == nil {
				if got != nil {
					t.Fatalf("Err(nil) = %v", got)
				}
				return
			}
			if tc.same && got != tc.err {
				t.Fatalf("Err = %v, want the error unchanged (%v)", got, tc.err)
			}
			for _, w := range tc.want {
				if !errors.Is(got, w) {
					t.Fatalf("Err = %v, want errors.Is %v", got, w)
				}
			}
		})
	}
}

func noDeadline() (context.Context, context.CancelFunc) {
	return context.WithCancel(context.Background())
}

func deadlineIn(d time.Duration) func() (context.Context, context.CancelFunc) {
	return func() (context.Context, context.CancelFunc) { return context.WithTimeout(context.Background(), d) }
}

func expired() (context.Context, context.CancelFunc) {
	return context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
}

func cancelledWith(cause error) func() (context.Context, context.CancelFunc) {
	return func() (context.Context, context.CancelFunc) {
		ctx, cancel := context.WithCancelCause(context.Background())
		cancel(cause)
		return ctx, func() {}
	}
}

func timeoutCause(cause error) func() (context.Context, context.CancelFunc) {
	return func() (context.Context, context.CancelFunc) {
		return context.WithTimeoutCause(context.Background(), 10*time.Millisecond, cause)
	}
}

// Against a real member that answers deadline-carrying calls as etcd 3.4
// does, before the client's ctx is done: a plain client call surfaces the
// server's error; Err recognises it as the deadline; KV never sends the
// deadline, so its calls are served.
func TestServerExpiry(t *testing.T) {
	// The member answers 40 ms before the deadline: within Err's slack, and
	// early enough that its answer usually beats the client's own timer. On
	// a busy machine the client's timer can still win an attempt (with a
	// 5 ms lead it did, and the call showed the client's own error): an
	// attempt the client's timer won is made again, up to 20.
	exp := etcdtest.NewExpiry34(40 * time.Millisecond)
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync(), exp.Option())
	cli := etcd.Client(t)

	t.Run("plain client", func(t *testing.T) {
		for attempt := 1; ; attempt++ {
			ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
			_, err := cli.Txn(ctx).Then(clientv3.OpPut("/k", "v")).Commit()
			if errors.Is(err, context.DeadlineExceeded) && attempt < 20 {
				cancel()
				continue // the client's timer won this one
			}
			if err == nil || errors.Is(err, context.DeadlineExceeded) {
				cancel()
				t.Fatalf("raw Txn error = %v after %d attempts; want the server's own deadline answer (the fault was not injected)", err, attempt)
			}
			got := etcdcall.Err(ctx, err)
			cancel()
			if !errors.Is(got, context.DeadlineExceeded) {
				t.Fatalf("Err = %v, want context.DeadlineExceeded", got)
			}
			return
		}
	})

	t.Run("KV wrapper", func(t *testing.T) {
		kv := etcdcall.KV(cli)
		before := exp.WithDeadline()
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		resp, err := kv.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision("/w"), "=", 0)).
			Then(clientv3.OpPut("/w", "v")).Else(clientv3.OpGet("/w")).Commit()
		if err != nil || !resp.Succeeded {
			t.Fatalf("wrapped Txn: %v %+v", err, resp)
		}
		if _, err := kv.Get(ctx, "/w"); err != nil {
			t.Fatalf("wrapped Get: %v", err)
		}
		if _, err := kv.Put(ctx, "/w2", "v"); err != nil {
			t.Fatalf("wrapped Put: %v", err)
		}
		if _, err := kv.Delete(ctx, "/w2"); err != nil {
			t.Fatalf("wrapped Delete: %v", err)
		}
		if n := exp.WithDeadline() - before; n != 0 {
			t.Fatalf("%d wrapped calls reached the server with a deadline", n)
		}
	})

	t.Run("Run", func(t *testing.T) {
		before := exp.WithDeadline()
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		err := etcdcall.Run(ctx, func(ctx context.Context) error {
			_, err := cli.Grant(ctx, 5)
			return err
		})
		if err != nil {
			t.Fatalf("grant: %v", err)
		}
		if n := exp.WithDeadline() - before; n != 0 {
			t.Fatalf("the grant reached the server with a deadline")
		}
	})
}

// A budget ends a call in flight with its own cause, and sends no deadline.
func TestBudget(t *testing.T) {
	exp := etcdtest.NewExpiry34(5 * time.Millisecond)
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync(), exp.Option())
	cli := etcd.Client(t)
	kv := etcdcall.KV(cli)

	ctx, cancel := etcdcall.Budget(t.Context(), 50*time.Millisecond, errBudget)
	defer cancel()
	if _, ok := ctx.Deadline(); ok {
		t.Fatal("a budget has a deadline")
	}
	// A watch on a key nobody writes blocks until the budget ends.
	for range cli.Watch(ctx, "/never") {
	}
	if err := etcdcall.CauseOf(ctx); !errors.Is(err, errBudget) || !errors.Is(err, context.Canceled) {
		t.Fatalf("budget ended with %v, want %v", err, errBudget)
	}
	if _, err := kv.Get(ctx, "/x"); !errors.Is(err, errBudget) {
		t.Fatalf("Get after the budget: %v, want %v", err, errBudget)
	}
	if exp.WithDeadline() != 0 {
		t.Fatal("a call under a budget reached the server with a deadline")
	}
}
