package bench

import (
	"context"
	"sync/atomic"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
)

// EtcdCounter counts the KV requests a run sends to etcd, as its gRPC
// clients send them (client side; EtcdServerMetrics reads what etcd itself
// applied): what an order costs the store, whatever the machine's speed.
// Give its Interceptor to the clients of the strategies under test; the
// bench's own reads (the truth checks, the books) pass Uncounted.
type EtcdCounter struct {
	reads, writes, puts, cmps, refused atomic.Int64
	groups, refusedGroups              atomic.Int64
	// writesAnswered are the counted writes answered without an error:
	// each was applied by etcd before its answer came (see writeEdges).
	writesAnswered atomic.Int64
}

// EtcdCounts are the requests counted, from a Snapshot to another.
type EtcdCounts struct {
	// Reads are Range requests and transactions with no put or delete.
	Reads int64 `json:"reads"`
	// Writes are Put and DeleteRange requests and transactions with a put
	// or delete in either branch (each one fsynced write when it commits).
	Writes int64 `json:"writes"`
	// Puts are the keys put or deleted by writes' success branches;
	// Compares the compares of their transactions (nested ones' included).
	Puts     int64 `json:"puts"`
	Compares int64 `json:"compares"`
	// Refused are the write transactions that etcd answered with
	// Succeeded false: refused by their compares (their Else branch ran
	// instead), or with a transaction nested in them refused (the
	// committer's groups of orders: some of its orders were not served by
	// it). etcd counts no such thing itself; this is the client's count of
	// the answers it got.
	Refused int64 `json:"refused"`
	// Groups are the parts of write transactions that commit or are
	// refused on their own: each transaction nested in one (the
	// committer's groups of orders that share no key), or the transaction
	// itself when it nests none; RefusedGroups those refused.
	Groups        int64 `json:"groups"`
	RefusedGroups int64 `json:"refusedGroups"`
}

// Snapshot returns the counts so far.
func (c *EtcdCounter) Snapshot() EtcdCounts {
	if c == nil {
		return EtcdCounts{}
	}
	return EtcdCounts{Reads: c.reads.Load(), Writes: c.writes.Load(), Puts: c.puts.Load(), Compares: c.cmps.Load(), Refused: c.refused.Load(),
		Groups: c.groups.Load(), RefusedGroups: c.refusedGroups.Load()}
}

// Sub returns the counts from earlier to e.
func (e EtcdCounts) Sub(earlier EtcdCounts) EtcdCounts {
	return EtcdCounts{Reads: e.Reads - earlier.Reads, Writes: e.Writes - earlier.Writes, Puts: e.Puts - earlier.Puts,
		Compares: e.Compares - earlier.Compares, Refused: e.Refused - earlier.Refused,
		Groups: e.Groups - earlier.Groups, RefusedGroups: e.RefusedGroups - earlier.RefusedGroups}
}

type uncountedKey struct{}

// Uncounted marks ctx's requests as the bench's own: not counted.
func Uncounted(ctx context.Context) context.Context {
	return context.WithValue(ctx, uncountedKey{}, true)
}

// Interceptor counts each KV request before sending it, and each write
// transaction answered as refused by its compares (lease and watch traffic
// is not counted: it does not grow with the orders).
func (c *EtcdCounter) Interceptor() grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		write, writeTxn := false, false
		if ctx.Value(uncountedKey{}) == nil {
			write, writeTxn = c.count(req)
		}
		err := invoker(ctx, method, req, reply, cc, opts...)
		if write && err == nil {
			c.writesAnswered.Add(1)
		}
		if writeTxn && err == nil {
			if r, ok := reply.(*pb.TxnResponse); ok {
				if refused(r) {
					c.refused.Add(1)
				}
				groups, refusedGroups := groupsOf(r)
				c.groups.Add(groups)
				c.refusedGroups.Add(refusedGroups)
			}
		}
		return err
	}
}

// writeEdges returns the counted writes sent so far and those answered
// without an error so far. Taken just before and just after a snapshot of
// etcd's own counters at each edge of a window, they bound the writes
// etcd can have applied between its two snapshots, however many were in
// flight at the edges (writeBounds).
func (c *EtcdCounter) writeEdges() (sent, answered int64) {
	if c == nil {
		return 0, 0
	}
	return c.writes.Load(), c.writesAnswered.Load()
}

// count counts req; it says whether req is a write, and a write
// transaction.
func (c *EtcdCounter) count(req any) (write, writeTxn bool) {
	switch r := req.(type) {
	case *pb.RangeRequest:
		c.reads.Add(1)
	case *pb.PutRequest, *pb.DeleteRangeRequest:
		c.writes.Add(1)
		c.puts.Add(1)
		return true, false
	case *pb.TxnRequest:
		puts, cmps := writeOps(r.Success)
		if other, _ := writeOps(r.Failure); puts == 0 && other == 0 {
			c.reads.Add(1)
			return false, false
		}
		c.writes.Add(1)
		c.puts.Add(int64(puts))
		c.cmps.Add(int64(len(r.Compare) + cmps))
		return true, true
	}
	return false, false
}

// writeOps counts the puts and deletes of a transaction branch, and the
// compares of the nested transactions in it, with what their own success
// branches put and compare (the committer nests one transaction per group
// of orders that share no key; a nested transaction whose compares fail
// writes nothing, but its puts are counted as sent, as a refused
// transaction's are).
func writeOps(ops []*pb.RequestOp) (puts, cmps int) {
	for _, op := range ops {
		switch r := op.Request.(type) {
		case *pb.RequestOp_RequestPut, *pb.RequestOp_RequestDeleteRange:
			puts++
		case *pb.RequestOp_RequestTxn:
			p, c := writeOps(r.RequestTxn.Success)
			puts += p
			cmps += len(r.RequestTxn.Compare) + c
		}
	}
	return puts, cmps
}

// groupsOf counts a write transaction's groups (see EtcdCounts.Groups)
// and those refused: a transaction refused, or with no transaction nested
// in the branch it took, is one group.
func groupsOf(r *pb.TxnResponse) (groups, refused int64) {
	if r.Succeeded {
		for _, op := range r.Responses {
			if t := op.GetResponseTxn(); t != nil {
				groups++
				if !t.Succeeded {
					refused++
				}
			}
		}
	}
	if groups == 0 {
		groups = 1
		if !r.Succeeded {
			refused = 1
		}
	}
	return groups, refused
}

// refused reports whether a write transaction, or any transaction nested
// in the branch it took, was refused by its compares.
func refused(r *pb.TxnResponse) bool {
	if !r.Succeeded {
		return true
	}
	for _, op := range r.Responses {
		if t := op.GetResponseTxn(); t != nil && refused(t) {
			return true
		}
	}
	return false
}
