package cli

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/stockctl/stockctl/coordinator"
)

// interruptInit interrupts a creation: the second transaction that writes a
// segment counter under prefix is not sent.
type interruptInit struct {
	prefix string
	seen   atomic.Int64
}

func (f *interruptInit) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if txn, ok := req.(*pb.TxnRequest); ok {
		for _, op := range txn.Success {
			if put := op.GetRequestPut(); put != nil && strings.HasPrefix(string(put.Key), f.prefix) {
				if f.seen.Add(1) == 2 {
					return status.Error(codes.Unavailable, "injected: init interrupted")
				}
				break
			}
		}
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

// Invariant (issue 19, item 5): `init` resuming an interrupted creation
// with another --initial-fill exits 5 naming the fill in progress; with the
// same values it completes the creation and prints the fill etcd holds.
func TestInitResumesOnlyWithItsFill(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	cut := &interruptInit{prefix: e.prefix + "stock/tee/seg/"}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{shared.endpoints}, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(cut.intercept)}})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	c, err := coordinator.New(cli, coordinator.WithPrefix(e.prefix), coordinator.WithMaxTxnOps(10))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.CreateSKU(t.Context(), "tee", coordinator.SKUConfig{Total: 1000, Segments: 20, InitialFill: 630}); err == nil || cut.seen.Load() != 2 {
		t.Fatalf("the interrupted creation: %v after %d fill transactions", err, cut.seen.Load())
	}

	e.fails(ExitConflict, "an interrupted creation is in progress with total 1000, 20 segments, initial fill 630",
		"init", "tee", "--total", "1000", "--segments", "20", "--initial-fill", "5")
	var v skuView
	e.json(&v, "init", "tee", "--total", "1000", "--segments", "20", "--initial-fill", "630")
	var st statusView
	e.json(&st, "status", "tee")
	var inSegments int64
	for _, s := range st.Segments {
		inSegments += s.Remaining
	}
	if v.InitialFill != 630 || inSegments != 630 || st.Pool != 370 {
		t.Fatalf("init printed initial fill %d; etcd holds %d in the segments and %d in the pool", v.InitialFill, inSegments, st.Pool)
	}
}
