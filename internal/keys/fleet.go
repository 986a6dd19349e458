package keys

// Keys of a coordinator over several etcd clusters (coordinator.NewClusters).
// A one-cluster coordinator never reads or writes them.
//
//	P fleet                  in every cluster: the fleet record (this cluster's
//	                         name and the fleet's ordered cluster list)
//	P placement/<sku>        in the registry (the fleet's first cluster) only:
//	                         the SKU's placement claim, naming its cluster
//	P pin/<sku>              in the SKU's cluster: the pin that fences the
//	                         SKU's creation there (the claim's generation, and
//	                         whether it is live or forgotten)
//	P decisions/<sku>/<id>   in the cluster of <sku>, the first SKU by name of
//	                         order <id> over several clusters: its commit
//	                         decision, "committed" or "aborted"
//	P removed/<cluster>      in the registry only: a cluster being removed
//	                         from the fleet, or removed (coordinator's
//	                         RemoveCluster); no SKU is claimed in it

// Fleet is the fleet record of a cluster.
func (s Space) Fleet() string { return s.prefix + "fleet" }

// Placement is sku's placement claim (in the registry cluster).
func (s Space) Placement(sku string) string { return s.prefix + "placement/" + sku }

// Pin is sku's creation pin (in the cluster the SKU is placed in).
func (s Space) Pin(sku string) string { return s.prefix + "pin/" + sku }

// Decisions is the prefix of the commit decisions of the orders over
// several clusters whose first SKU (by name) is sku.
func (s Space) Decisions(sku string) string { return s.prefix + "decisions/" + sku + "/" }

// Decision is the commit decision of order id over several clusters,
// "committed" or "aborted", kept in the cluster of the order's first SKU by
// name, sku, beside that SKU's record of the order.
func (s Space) Decision(sku, id string) string { return s.Decisions(sku) + id }

// Removed is the registry's record of a cluster being removed from the
// fleet, or removed.
func (s Space) Removed(cluster string) string { return s.RemovedPrefix() + cluster }

// RemovedPrefix prefixes every Removed key.
func (s Space) RemovedPrefix() string { return s.prefix + "removed/" }
