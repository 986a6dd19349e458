package coordinator

// RendezvousForTest is the cluster of names a SKU named key hashes to.
func RendezvousForTest(names []string, key string) string { return rendezvous(names, key) }
