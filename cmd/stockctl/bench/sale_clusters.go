package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/rebalance"
)

// SaleCluster is one etcd cluster of a run over several (SaleConfig.Clusters):
// its name, a client per process, and the counter of those clients' requests
// (their interceptor).
type SaleCluster struct {
	Name    string
	Etcd    []*clientv3.Client
	Counter *EtcdCounter
}

// ClusterShare is one cluster's part of a row run over several clusters:
// what it holds and what it was asked, as counts and as shares of all the
// clusters'.
type ClusterShare struct {
	Cluster string `json:"cluster"`
	// SKUs placed in the cluster, and their share of the row's.
	SKUs     int     `json:"skus"`
	SKUShare float64 `json:"skuShare"`
	// Etcd are the requests the strategy's clients sent to the cluster in
	// the selling window (its EtcdCounter); RequestShare is its reads and
	// writes ÷ all the clusters'.
	Etcd         EtcdCounts `json:"etcd"`
	RequestShare float64    `json:"requestShare"`
	// Keys and Deletes are the keys the cluster wrote and deleted under the
	// run's prefix in the selling window, every writer included (the
	// coordinators, the rebalancers): the put and delete events of its
	// history, read back after the window. etcd's own etcd_mvcc_put_total
	// cannot be had per cluster here: the embedded etcds of one process
	// share one registry (the row's EtcdServer is their sum). KeyShare is
	// Keys ÷ all the clusters'.
	Keys     int64   `json:"keys"`
	Deletes  int64   `json:"deletes"`
	KeyShare float64 `json:"keyShare"`
}

// StockctlClustersSale is StockctlSale on a coordinator over every cluster
// of the run (SaleConfig.Clusters, coordinator.NewClusters), one per
// process, with a rebalancer elected in each cluster. Its rows report
// their clusters' shares (SaleRow.Clusters); refusals' truth is checked in
// the SKU's cluster, at its revisions. It takes no carts: an order's lines
// must share a cluster, and the cart shape draws its SKUs at random.
func StockctlClustersSale(n int) SaleSpec {
	return SaleSpec{Name: fmt.Sprintf("stockctl-%dclusters", n), Title: fmt.Sprintf("stockctl Allocate, no step, over %d etcd clusters", n),
		New: func() SaleStrategy { return &clustersSale{} }}
}

type clustersSale struct {
	p      SaleParams
	coords []*coordinator.Coordinator // one per process, over every cluster
	reb    *coordinator.Coordinator   // the rebalancers', a process of its own
	stop   func()
	// rebFailures counts the rebalancers' warnings.
	rebFailures warnCounter
	// placed is each SKU's cluster (an index into p.Clusters), read once
	// after the SKUs are created, for the truth checks: ClusterOf would
	// read every cluster each time (counted, on the coordinator's context).
	placed map[string]int
}

func (s *clustersSale) Setup(ctx context.Context, p SaleParams) error {
	s.p = p
	if len(p.Clusters) < 2 {
		return fmt.Errorf("%w: %d clusters: a run over clusters needs 2 or more", ErrInvalidConfig, len(p.Clusters))
	}
	open := func(proc int) (*coordinator.Coordinator, error) {
		cls := make([]coordinator.Cluster, len(p.Clusters))
		for i, cl := range p.Clusters {
			cls[i] = coordinator.Cluster{Name: cl.Name, Client: cl.Etcd[proc]}
		}
		return coordinator.NewClusters(ctx, cls, coordinator.WithPrefix(p.Prefix))
	}
	for i := range p.Processes {
		c, err := open(i)
		if err != nil {
			return err
		}
		s.coords = append(s.coords, c)
	}
	var err error
	if s.reb, err = open(0); err != nil {
		return err
	}
	cfg := noStepConfig(p.Shape.Stock, p.Segments)
	if err := forEachSKU(ctx, p.Shape.SKUs, func(i int) error {
		_, err := s.coords[0].CreateSKU(ctx, SKUName(i), cfg)
		return err
	}); err != nil {
		return fmt.Errorf("create the SKUs: %w", err)
	}
	s.placed = map[string]int{}
	for _, l := range s.coords[0].ClusterSKUs(Uncounted(ctx)) {
		if l.Err != nil {
			return fmt.Errorf("list the clusters' SKUs: %w", l.Err)
		}
		for i, cl := range p.Clusters {
			if cl.Name == l.Cluster {
				for _, sku := range l.SKUs {
					s.placed[sku] = i
				}
			}
		}
	}
	// Every process learns every SKU's cluster before the sale, as a
	// process that has been serving would have: the selling window counts
	// the orders' requests, not the first lookups (a miss reads every
	// cluster).
	for _, c := range s.coords[1:] {
		if err := forEachSKU(ctx, p.Shape.SKUs, func(i int) error {
			_, err := c.ClusterOf(ctx, SKUName(i))
			return err
		}); err != nil {
			return fmt.Errorf("look the SKUs up: %w", err)
		}
	}
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	for _, name := range s.reb.Clusters() {
		r, err := rebalance.New(s.reb.Cluster(name), rebalance.Config{Identity: "bench-rebalancer-" + name, Logger: slog.New(&s.rebFailures)})
		if err != nil {
			cancel()
			wg.Wait()
			return err
		}
		wg.Go(func() { _ = r.Run(rctx) })
	}
	var once sync.Once
	s.stop = func() { once.Do(func() { cancel(); wg.Wait() }) }
	return nil
}

func (s *clustersSale) sale() *stockctlSale {
	return &stockctlSale{p: s.p, fleet: fleet{coords: s.coords}}
}

func (s *clustersSale) Order(ctx context.Context, process, sku int, order string) (OrderOutcome, error) {
	return s.sale().Order(ctx, process, sku, order)
}

func (s *clustersSale) Release(ctx context.Context, process, sku int, order string) error {
	return s.sale().Release(ctx, process, sku, order)
}

func (s *clustersSale) Verify(ctx context.Context) (SaleBooks, error) {
	if s.stop != nil {
		s.stop()
	}
	b, err := s.sale().Verify(ctx)
	if p := s.rebFailures.problem(); p != "" {
		b.Problems = append(b.Problems, p)
	}
	return b, err
}

func (s *clustersSale) Teardown(ctx context.Context) error {
	if s.stop != nil {
		s.stop()
	}
	var errs []error
	for _, c := range append(s.coords, s.reb) {
		if c != nil {
			errs = append(errs, c.Close())
		}
	}
	for _, cl := range s.p.Clusters {
		errs = append(errs, deletePrefix(ctx, cl.Etcd[0], s.p.Prefix))
	}
	return errors.Join(errs...)
}

// clientOf is the client of process's connection to the cluster that
// holds sku, with that cluster's coordinator.
func (s *clustersSale) clientOf(ctx context.Context, process, sku int) (*clientv3.Client, *coordinator.Coordinator, error) {
	i, ok := s.placed[SKUName(sku)]
	if !ok {
		return nil, nil, fmt.Errorf("%s is in no cluster's listing", SKUName(sku))
	}
	cl := s.p.Clusters[i]
	return cl.Etcd[process], s.coords[process].Cluster(cl.Name), nil
}

// NowOf is the revision of the cluster that holds sku (a linearizable read).
func (s *clustersSale) NowOf(ctx context.Context, process, sku int) (int64, error) {
	cli, _, err := s.clientOf(ctx, process, sku)
	if err != nil {
		return 0, err
	}
	resp, err := cli.Get(ctx, s.p.Prefix+"bench-now", clientv3.WithCountOnly())
	if err != nil {
		return 0, err
	}
	return resp.Header.Revision, nil
}

// RemainingAt is what sku held in all at revision rev of its cluster.
func (s *clustersSale) RemainingAt(ctx context.Context, sku int, rev int64) (int64, error) {
	cli, c, err := s.clientOf(ctx, 0, sku)
	if err != nil {
		return 0, err
	}
	return remainingAt(ctx, cli, c, sku, rev)
}

// skuCounts is how many SKUs each cluster holds, by name.
func (s *clustersSale) skuCounts(ctx context.Context) (map[string]int, error) {
	out := map[string]int{}
	for _, l := range s.coords[0].ClusterSKUs(ctx) {
		if l.Err != nil {
			return nil, l.Err
		}
		out[l.Cluster] = len(l.SKUs)
	}
	return out, nil
}

// clusterWindow is one cluster's counts at a selling window's start.
type clusterWindow struct {
	client EtcdCounts
	rev    int64
}

// startClusters snapshots every cluster's counter and revision.
func startClusters(ctx context.Context, cls []SaleCluster, prefix string) ([]clusterWindow, error) {
	out := make([]clusterWindow, len(cls))
	for i, cl := range cls {
		out[i].client = cl.Counter.Snapshot()
		resp, err := cl.Etcd[0].Get(Uncounted(ctx), prefix+"bench-now", clientv3.WithCountOnly())
		if err != nil {
			return nil, fmt.Errorf("cluster %s: %w", cl.Name, err)
		}
		out[i].rev = resp.Header.Revision
	}
	return out, nil
}

// endClusters makes the clusters' shares of the window begun at start:
// their requests since (counts), their keys written under prefix since
// (read from their history up to a mark put now), their SKUs from skus.
func endClusters(ctx context.Context, cls []SaleCluster, prefix string, start []clusterWindow, counts []EtcdCounts, skus map[string]int) ([]ClusterShare, error) {
	out := make([]ClusterShare, len(cls))
	for i, cl := range cls {
		out[i] = ClusterShare{Cluster: cl.Name, SKUs: skus[cl.Name], Etcd: counts[i]}
	}
	// The marks first, in every cluster, so that the windows end together.
	ends := make([]int64, len(cls))
	for i, cl := range cls {
		resp, err := cl.Etcd[0].Put(Uncounted(ctx), prefix+windowMark, "")
		if err != nil {
			return nil, fmt.Errorf("cluster %s: mark the window's end: %w", cl.Name, err)
		}
		ends[i] = resp.Header.Revision
	}
	for i, cl := range cls {
		var err error
		if out[i].Keys, out[i].Deletes, err = keysWritten(ctx, cl.Etcd[0], prefix, start[i].rev, ends[i]); err != nil {
			return nil, fmt.Errorf("cluster %s: count its keys: %w", cl.Name, err)
		}
	}
	var skuSum, reqSum, keySum int64
	for _, c := range out {
		skuSum += int64(c.SKUs)
		reqSum += c.Etcd.Reads + c.Etcd.Writes
		keySum += c.Keys
	}
	share := func(a, b int64) float64 {
		if b <= 0 {
			return 0
		}
		return float64(a) / float64(b)
	}
	for i := range out {
		c := &out[i]
		c.SKUShare, c.RequestShare, c.KeyShare = share(int64(c.SKUs), skuSum), share(c.Etcd.Reads+c.Etcd.Writes, reqSum), share(c.Keys, keySum)
	}
	return out, nil
}

// windowMark is the key put under a run's prefix at a window's end.
const windowMark = "bench-window-end"

// keysWritten counts the put and delete events under prefix after
// revision from and before revision end (the window's mark, put at end),
// reading the history up to the mark.
func keysWritten(ctx context.Context, cli *clientv3.Client, prefix string, from, end int64) (puts, dels int64, err error) {
	ctx = Uncounted(ctx)
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	for wr := range cli.Watch(wctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(from+1)) {
		if err := wr.Err(); err != nil {
			return 0, 0, err
		}
		for _, ev := range wr.Events {
			if ev.Kv.ModRevision >= end {
				return puts, dels, nil
			}
			if ev.Type == clientv3.EventTypeDelete {
				dels++
			} else {
				puts++
			}
		}
	}
	return 0, 0, fmt.Errorf("the watch ended before the mark at revision %d: %w", end, context.Cause(ctx))
}
