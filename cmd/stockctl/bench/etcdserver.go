package bench

import (
	"fmt"
	"math"

	"github.com/prometheus/client_golang/prometheus"
)

// EtcdServerMetrics reads etcd's own counters of what it applied from the
// Prometheus registry of an etcd server running in this process (the
// embedded etcd registers its metrics in prometheus.DefaultRegisterer).
// Unlike EtcdCounter it sees every writer (the coordinators, the
// rebalancer, anything else on that etcd), and it counts what etcd did,
// not what the clients asked for.
//
// The counters are the process's: they are only the bench's when the
// process runs no other etcd traffic (stockctl bench does not). A cluster
// of Members members in this process counts every write once per member,
// as each applies it; Snapshot divides by Members.
type EtcdServerMetrics struct {
	Gatherer prometheus.Gatherer
	Members  int
}

// EtcdServerCounts are etcd's counters, from a Snapshot to another.
type EtcdServerCounts struct {
	// Puts is etcd_mvcc_put_total: keys written (one per put operation,
	// in a Put request or a transaction's branch that ran, lease
	// attachment or not).
	Puts int64 `json:"puts"`
	// Deletes is etcd_mvcc_delete_total: delete operations applied (one
	// per DeleteRange operation, however many keys it removed, and one
	// per key a revoked lease removed).
	Deletes int64 `json:"deletes"`
	// Writes are the write requests etcd applied through raft: the count
	// of etcd_server_apply_duration_seconds for op Put, DeleteRange and
	// Txn (a Txn with a put or delete in either branch; read-only ones
	// are not applied through raft). Each is one commit to the log.
	Writes int64 `json:"writes"`
	// MvccTxns is etcd_mvcc_txn_total, shown as etcd has it, not a count
	// of transactions: etcd counts each read or write view of its store
	// that did more than one operation, so a transaction with two or more
	// compares counts once for its compares and once more if it then puts
	// or deletes two or more keys, and a single put never counts.
	MvccTxns int64 `json:"mvccTxns"`
	// Ranges is etcd_mvcc_range_total: range operations, each compare of
	// a transaction included (etcd evaluates a compare as a range).
	Ranges int64 `json:"ranges"`
}

// Sub returns the counts from earlier to e.
func (e EtcdServerCounts) Sub(earlier EtcdServerCounts) EtcdServerCounts {
	return EtcdServerCounts{Puts: e.Puts - earlier.Puts, Deletes: e.Deletes - earlier.Deletes, Writes: e.Writes - earlier.Writes,
		MvccTxns: e.MvccTxns - earlier.MvccTxns, Ranges: e.Ranges - earlier.Ranges}
}

// Snapshot returns etcd's counters now (divided by the member count). A
// registry without etcd's mvcc counters is an error: there is no etcd
// server in this process to count.
func (m *EtcdServerMetrics) Snapshot() (EtcdServerCounts, error) {
	mfs, err := m.Gatherer.Gather()
	if err != nil {
		return EtcdServerCounts{}, err
	}
	var sums = map[string]float64{}
	found := map[string]bool{}
	for _, mf := range mfs {
		name := mf.GetName()
		switch name {
		case "etcd_mvcc_put_total", "etcd_mvcc_delete_total", "etcd_mvcc_txn_total", "etcd_mvcc_range_total":
			found[name] = true
			for _, mt := range mf.GetMetric() {
				sums[name] += mt.GetCounter().GetValue()
			}
		case "etcd_server_apply_duration_seconds":
			found[name] = true
			for _, mt := range mf.GetMetric() {
				for _, l := range mt.GetLabel() {
					if l.GetName() == "op" {
						switch l.GetValue() {
						case "Put", "DeleteRange", "Txn":
							sums[name] += float64(mt.GetHistogram().GetSampleCount())
						}
					}
				}
			}
		}
	}
	if !found["etcd_mvcc_put_total"] {
		return EtcdServerCounts{}, fmt.Errorf("no etcd_mvcc_put_total in the registry: no etcd server in this process")
	}
	n := float64(max(m.Members, 1))
	c := func(name string) int64 { return int64(math.Round(sums[name] / n)) }
	return EtcdServerCounts{Puts: c("etcd_mvcc_put_total"), Deletes: c("etcd_mvcc_delete_total"), Writes: c("etcd_server_apply_duration_seconds"),
		MvccTxns: c("etcd_mvcc_txn_total"), Ranges: c("etcd_mvcc_range_total")}, nil
}

// OrderCosts are a row's figures per served order: what an order cost
// etcd. A figure that cannot be had (not counted, or no order served) is
// null.
type OrderCosts struct {
	// KeysPerOrder and DeletesPerOrder are etcd's own puts and delete
	// operations (EtcdServerCounts) ÷ served orders.
	KeysPerOrder    *float64 `json:"keysPerOrder"`
	DeletesPerOrder *float64 `json:"deletesPerOrder"`
	// KeysPerLine is KeysPerOrder ÷ the lines of a served order (their
	// mean, in a cart-mix shape), for a cart shape (SaleShape.Lines); nil
	// otherwise.
	KeysPerLine *float64 `json:"keysPerLine,omitempty"`
	// ComparesPerOrder and TxnsPerOrder are the client's count
	// (EtcdCounts): compares of write transactions, and write requests,
	// ÷ served orders.
	ComparesPerOrder *float64 `json:"comparesPerOrder"`
	TxnsPerOrder     *float64 `json:"txnsPerOrder"`
	// OrdersPerCommit is served orders ÷ the write requests etcd applied
	// (EtcdServerCounts.Writes).
	OrdersPerCommit *float64 `json:"ordersPerCommit"`
	// RefusedCommits is the client's write transactions answered as
	// refused by their compares ÷ its write transactions (not per order).
	RefusedCommits *float64 `json:"refusedCommits"`
	// RefusedGroups is the groups of those transactions refused by their
	// compares ÷ their groups (EtcdCounts.Groups): with the committer's
	// nested groups, about the share of orders sent again or moved.
	RefusedGroups *float64 `json:"refusedGroups"`
	// CPUMicrosPerOrder is the bench process's CPU time over the selling
	// window (SaleRow.CPUSeconds) ÷ served orders, in µs: on a machine
	// the sale saturates, what bounds its rate. Null when etcd does not
	// run in the process (its CPU would be missing).
	CPUMicrosPerOrder *float64 `json:"cpuMicrosPerOrder"`
}

// addCPU sets CPUMicrosPerOrder from a row's CPU seconds (0: unknown).
func (c *OrderCosts) addCPU(seconds float64, served int64) {
	if seconds > 0 && served > 0 {
		v := seconds * 1e6 / float64(served)
		c.CPUMicrosPerOrder = &v
	}
}

// orderCosts computes a row's OrderCosts from what was counted.
func orderCosts(served int64, client *EtcdCounts, server *EtcdServerCounts) OrderCosts {
	ratio := func(a, b int64) *float64 {
		if b <= 0 {
			return nil
		}
		v := float64(a) / float64(b)
		return &v
	}
	var c OrderCosts
	if server != nil {
		c.KeysPerOrder, c.DeletesPerOrder = ratio(server.Puts, served), ratio(server.Deletes, served)
		if served > 0 {
			c.OrdersPerCommit = ratio(served, server.Writes)
		}
	}
	if client != nil {
		c.ComparesPerOrder, c.TxnsPerOrder = ratio(client.Compares, served), ratio(client.Writes, served)
		c.RefusedCommits = ratio(client.Refused, client.Writes)
		c.RefusedGroups = ratio(client.RefusedGroups, client.Groups)
	}
	return c
}
