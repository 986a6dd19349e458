package bench

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
)

// A sale over 3 clusters reports each cluster's share of the SKUs, of the
// etcd requests and of the keys written: they add up, each cluster got
// some, and the row's requests are the clusters' sum. The one-cluster row
// of the same run reports none.
func TestRunSaleClusters(t *testing.T) {
	var cls []SaleCluster
	for i := range 3 {
		counter := &EtcdCounter{}
		cls = append(cls, SaleCluster{Name: fmt.Sprintf("c%d", i), Etcd: startEtcd(t, 2, grpc.WithChainUnaryInterceptor(counter.Interceptor())), Counter: counter})
	}
	// The storm's 4 SKUs of 1 unit sell out whatever the machine's speed
	// (each of the 6 buyers orders at least 3 times; 4 SKUs of 20 units
	// did not sell out in a second on a busy machine), and every refusal
	// after a buyer's first is checked (so at least 2 buyers' are).
	shapes := []SaleShape{{Name: "many", SKUs: 30, Stock: Plenty}, {Name: "storm", SKUs: 4, Stock: 1}}
	rows, err := RunSale(t.Context(), SaleConfig{Specs: []SaleSpec{StockctlSale(), StockctlClustersSale(3)}, Shapes: shapes, Buyers: 6, Processes: 2,
		Segments: 2, Duration: 2 * time.Second, MinOrders: 3, Etcd: cls[0].Etcd, Prefix: "/bench-clusters-test/", TruthSample: 1, Counter: cls[0].Counter,
		Server: &EtcdServerMetrics{Gatherer: prometheus.DefaultGatherer, Members: 1}, Clusters: cls})
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 4 {
		t.Fatalf("%d rows, want the one-cluster row and the 3-cluster row of each shape", len(rows))
	}
	// The storm: its refusals, sampled, were true in their SKUs' clusters.
	if st := rows[3]; !st.OK || st.Strategy != "stockctl-3clusters" || st.Refusals == 0 || st.TruthChecked == 0 || st.Untrue != 0 || len(st.Clusters) != 3 {
		t.Errorf("storm over 3 clusters: %+v", st)
	}
	if one := rows[0]; !one.OK || one.Strategy != "stockctl" || one.Clusters != nil || one.Orders == 0 {
		t.Fatalf("one cluster: %+v", one)
	}
	r := rows[1]
	if !r.OK || r.Strategy != "stockctl-3clusters" || r.Orders == 0 || r.Etcd == nil || r.EtcdServer == nil || len(r.Clusters) != 3 {
		t.Fatalf("3 clusters: %+v", r)
	}
	var skus int
	var skuShare, reqShare, keyShare float64
	var sum EtcdCounts
	var keys int64
	for i, c := range r.Clusters {
		t.Logf("%+v", c)
		if c.Cluster != cls[i].Name || c.SKUs == 0 || c.Etcd.Writes == 0 || c.Keys == 0 || c.SKUShare <= 0 || c.RequestShare <= 0 || c.KeyShare <= 0 {
			t.Errorf("cluster %d got none of something: %+v", i, c)
		}
		skus += c.SKUs
		skuShare, reqShare, keyShare = skuShare+c.SKUShare, reqShare+c.RequestShare, keyShare+c.KeyShare
		sum.Reads, sum.Writes = sum.Reads+c.Etcd.Reads, sum.Writes+c.Etcd.Writes
		keys += c.Keys
	}
	if skus != 30 {
		t.Errorf("%d SKUs placed over the clusters, want 30", skus)
	}
	for name, s := range map[string]float64{"SKU": skuShare, "request": reqShare, "key": keyShare} {
		if math.Abs(s-1) > 1e-9 {
			t.Errorf("the %s shares add up to %v", name, s)
		}
	}
	// Requests: the row's are the clusters' (one snapshot of each);
	// keys: every served order wrote its record in one cluster or
	// another, and the clusters' histories hold about what every
	// embedded etcd of the process applied (give or take the rebalancers'
	// moves between the window's end and its marks).
	if sum.Reads != r.Etcd.Reads || sum.Writes != r.Etcd.Writes || sum.Writes == 0 {
		t.Errorf("the clusters' requests %+v, the row's %+v", sum, *r.Etcd)
	}
	if keys < r.Orders || keys > r.EtcdServer.Puts+r.EtcdServer.Puts/10+10 {
		t.Errorf("%d keys written in the clusters for %d orders; etcd counted %d puts", keys, r.Orders, r.EtcdServer.Puts)
	}
}
