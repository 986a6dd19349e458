package lock

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/stockctl/stockctl/internal/etcdtest"
)

// sessionEndsDuringDelete is a server interceptor: once armed, the first
// transaction that deletes key first runs during (the test ends the
// session there) and then fails, unapplied.
type sessionEndsDuringDelete struct {
	key    atomic.Value // string
	during func()
	armed  atomic.Bool
}

func (f *sessionEndsDuringDelete) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if txn, ok := req.(*pb.TxnRequest); ok && f.armed.Load() {
		for _, op := range txn.Success {
			if d := op.GetRequestDeleteRange(); d != nil && string(d.Key) == f.key.Load() && f.armed.CompareAndSwap(true, false) {
				f.during()
				return nil, status.Error(codes.Unavailable, "injected: the unlock's delete failed")
			}
		}
	}
	return handler(ctx, req)
}

// Invariant: Unlock never reports a lost hold as released. The unlock's
// delete fails while the session ends (its lease revoked, as when a paused
// process's lease expires): the key went with the lease, so the hold was
// lost, and Unlock says so (ErrLost). Before, the failed delete found the
// session over, called that nothing to retry, and Unlock returned nil
// (TestPausedHolderOnSecondCluster's "unlock after the pause succeeded",
// once in a CI run on a loaded machine).
func TestUnlockWhileTheSessionEndsIsLost(t *testing.T) {
	fault := &sessionEndsDuringDelete{}
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync(), etcdtest.WithGRPCServerOptions(grpc.ChainUnaryInterceptor(fault.intercept)))
	client := etcd.Client(t)
	raw := etcd.Client(t)
	// A short session, so that it learns of its lease's revocation soon;
	// the release timeout long, so that the fault, not it, fails the delete.
	e := newEngine(t, client, func(c *Config) { c.SessionTTL, c.ReleaseTimeout = 2*time.Second, time.Minute })
	ctx := t.Context()
	h, err := e.Acquire(ctx, "/t/locks/paused/", KindNamed, -1)
	if err != nil {
		t.Fatal(err)
	}
	sess, err := e.Session(ctx)
	if err != nil {
		t.Fatal(err)
	}
	fault.key.Store(h.Own().Key())
	fault.during = func() {
		if _, err := raw.Revoke(ctx, sess.Lease()); err != nil {
			t.Errorf("revoke the session's lease: %v", err)
			return
		}
		select {
		case <-sess.Done():
		case <-time.After(etcdtest.MinWait):
			t.Errorf("the session did not end within %v of its lease's revocation", etcdtest.MinWait)
		}
	}
	fault.armed.Store(true)
	err = h.Unlock(ctx)
	if fault.armed.Load() {
		t.Fatal("the unlock sent no delete: the fault was not injected")
	}
	if !errors.Is(err, ErrLost) || !strings.Contains(err.Error(), "gone") {
		t.Fatalf("unlock of a hold whose session ended during it: %v, want ErrLost", err)
	}
}
