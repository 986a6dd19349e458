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
//	P removed/<cluster>      in the registry only: a cluster being removed
//	                         from the fleet, or removed (coordinator's
//	                         RemoveCluster); no SKU is claimed in it

// Fleet is the fleet record of a cluster.
func (s Space) Fleet() string { return s.prefix + "fleet" }

// Placement is sku's placement claim (in the registry cluster).
func (s Space) Placement(sku string) string { return s.prefix + "placement/" + sku }

// Pin is sku's creation pin (in the cluster the SKU is placed in).
func (s Space) Pin(sku string) string { return s.prefix + "pin/" + sku }

// Removed is the registry's record of a cluster being removed from the
// fleet, or removed.
func (s Space) Removed(cluster string) string { return s.RemovedPrefix() + cluster }

// RemovedPrefix prefixes every Removed key.
func (s Space) RemovedPrefix() string { return s.prefix + "removed/" }
