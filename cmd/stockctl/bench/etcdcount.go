package bench

import (
	"context"
	"sync/atomic"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
)

// EtcdCounter counts the KV requests a run sends to etcd, as its gRPC
// clients send them: what an order costs the store, whatever the machine's
// speed. Give its Interceptor to the clients of the strategies under test;
// the bench's own reads (the truth checks, the books) pass Uncounted.
type EtcdCounter struct {
	reads, writes, puts, cmps atomic.Int64
}

// EtcdCounts are the requests counted, from a Snapshot to another.
type EtcdCounts struct {
	// Reads are Range requests and transactions with no put or delete.
	Reads int64 `json:"reads"`
	// Writes are Put and DeleteRange requests and transactions with a put
	// or delete in either branch (each one fsynced write when it commits).
	Writes int64 `json:"writes"`
	// Puts are the keys put or deleted by writes' success branches;
	// Compares the compares of their transactions.
	Puts     int64 `json:"puts"`
	Compares int64 `json:"compares"`
}

// Snapshot returns the counts so far.
func (c *EtcdCounter) Snapshot() EtcdCounts {
	if c == nil {
		return EtcdCounts{}
	}
	return EtcdCounts{Reads: c.reads.Load(), Writes: c.writes.Load(), Puts: c.puts.Load(), Compares: c.cmps.Load()}
}

// Sub returns the counts from earlier to e.
func (e EtcdCounts) Sub(earlier EtcdCounts) EtcdCounts {
	return EtcdCounts{Reads: e.Reads - earlier.Reads, Writes: e.Writes - earlier.Writes, Puts: e.Puts - earlier.Puts, Compares: e.Compares - earlier.Compares}
}

type uncountedKey struct{}

// Uncounted marks ctx's requests as the bench's own: not counted.
func Uncounted(ctx context.Context) context.Context {
	return context.WithValue(ctx, uncountedKey{}, true)
}

// Interceptor counts each KV request before sending it (lease and
// watch traffic is not counted: it does not grow with the orders).
func (c *EtcdCounter) Interceptor() grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if ctx.Value(uncountedKey{}) == nil {
			c.count(req)
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
}

func (c *EtcdCounter) count(req any) {
	switch r := req.(type) {
	case *pb.RangeRequest:
		c.reads.Add(1)
	case *pb.PutRequest, *pb.DeleteRangeRequest:
		c.writes.Add(1)
		c.puts.Add(1)
	case *pb.TxnRequest:
		puts := int64(writeOps(r.Success))
		if puts == 0 && writeOps(r.Failure) == 0 {
			c.reads.Add(1)
			return
		}
		c.writes.Add(1)
		c.puts.Add(puts)
		c.cmps.Add(int64(len(r.Compare)))
	}
}

// writeOps counts the puts and deletes of a transaction branch.
func writeOps(ops []*pb.RequestOp) int {
	n := 0
	for _, op := range ops {
		switch op.Request.(type) {
		case *pb.RequestOp_RequestPut, *pb.RequestOp_RequestDeleteRange:
			n++
		}
	}
	return n
}
