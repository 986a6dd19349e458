package coordinator

import (
	"sync"

	"github.com/stockctl/stockctl/segments"
)

// stockState is the coordinator's in-memory view of stock: what it caches
// of each SKU and each place.
type stockState struct {
	mu      sync.Mutex
	skus    map[string]*skuInfo
	places  map[placeID]*placeState
	sellers map[string]*seller

	commit   committer
	confirms confirmer
}

type placeID struct {
	sku   string
	place segments.Place
}

// skuInfo caches what never changes after a SKU is created.
type skuInfo struct {
	name     string
	segments int
	// refillBatch is what an order that finds no stock in this process's
	// segments moves from the pool at once (the policy as first read; a
	// later SetPolicy is seen by the rebalancer, not here).
	refillBatch int64
	// perUserLimit is the SKU's per-user limit (0: none), fixed at creation.
	perUserLimit int64
}

func (s *stockState) init() {
	s.skus = make(map[string]*skuInfo)
	s.places = make(map[placeID]*placeState)
	s.sellers = make(map[string]*seller)
}
