package bench

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Sale shapes. The lock shapes (Shape) sell one hot SKU that never runs
// out. A real flash sale differs: many SKUs go on sale at once, each sells
// out in seconds, and buyers keep ordering at many times the stock. A sale
// shape runs buyers ordering 1 unit at a time, flat out (no business
// step), over SKUs many or few, with stock small or large, optionally
// releasing a share of what they were served while they go on ordering.

// SaleShape is one sale to run.
type SaleShape struct {
	// Name names the shape in the table (--sale-shapes takes the names).
	Name string `json:"name"`
	// SKUs is how many SKUs the orders are spread over.
	SKUs int `json:"skus"`
	// Stock is each SKU's units; 0 creates them empty, Plenty enough that
	// no run sells out.
	Stock int64 `json:"stock"`
	// Release is the share of served orders the buyer releases again at
	// once, while everyone goes on ordering.
	Release float64 `json:"release"`
	// Skew is the Zipf exponent of the SKUs' popularity (a few hot, a long
	// tail); 0 is uniform.
	Skew float64 `json:"skew"`
	// Lines, when more than 1, makes every order a cart of Lines distinct
	// SKUs (drawn as single orders' SKUs are), 1 unit each, all taken or
	// none in one call (a CartStrategy's OrderCart); strategies without
	// carts do not run the shape.
	Lines int `json:"lines,omitempty"`
	// CartShare, with Lines above 1 and below 1 itself, makes only that
	// share of the orders carts, the rest single orders of one SKU over the
	// same SKUs: a shop where most buyers check out one product and some
	// several, so that carts meet segments that single orders sell from.
	CartShare float64 `json:"cartShare,omitempty"`
	// Batch, when positive, makes the shape the physical limit instead
	// of a sale: no SKUs, no strategy, etcd driven with order-sized puts
	// of new keys, Batch puts a transaction (see runLimitOne).
	Batch int `json:"batch,omitempty"`
	// Prepare readies every process for every SKU before the window
	// opens (a SalePreparer's Prepare: stockctl's Coordinator.Prepare);
	// strategies that cannot do not run the shape.
	Prepare bool `json:"prepare,omitempty"`
}

// Plenty is the stock of a SKU that no run sells out: more than a run of
// DefaultDuration can take from one SKU at any rate seen here.
const Plenty = 2_000_000

// Default sale-shape parameters.
const (
	// DefaultSaleSKUs is the SKU count of the many-SKU shapes
	// (--sale-skus sets it), DefaultSaleSKUsLarge the many-10k shape's.
	DefaultSaleSKUs      = 1000
	DefaultSaleSKUsLarge = 10_000
	// DefaultStormStock is the stock of a sell-out storm's SKU: it sells
	// out within a second, and the buyers go on ordering.
	DefaultStormStock = 1000
	// DefaultSaleRelease is the share of served orders released in the
	// release-race shape.
	DefaultSaleRelease = 0.3
	// DefaultSaleSkew is the Zipf exponent of the skewed shape.
	DefaultSaleSkew = 1.1
	// DefaultSaleBuyers and DefaultSaleSegments: 400 buyers, SKUs of 20
	// segments.
	DefaultSaleBuyers   = 400
	DefaultSaleSegments = 20
	// DefaultCartLines is the cart shape's lines an order (issue 32: a
	// cart of 3 over 1,000 SKUs).
	DefaultCartLines = 3
	// DefaultCartMixSKUs and DefaultCartMixShare: the cart-mix shape's
	// hundred products, one order in ten a cart of DefaultCartLines.
	DefaultCartMixSKUs  = 100
	DefaultCartMixShare = 0.1
	// DefaultTruthSample: one order in this many, of buyers refused
	// before, reads etcd's revision before it starts, and a refusal of it
	// is checked afterwards against the books at the refusal's revision.
	DefaultTruthSample = 20
)

// DefaultSaleShapes are the shapes `stockctl bench --sale` runs, in order:
// the sell-out storm, a SKU created empty, the storm with releases racing
// it, then one SKU, many SKUs, many skewed SKUs and ten times as many SKUs
// with plenty of stock (the many-SKU ratios compare the last three with
// "one"), the last two again with every process prepared for every SKU
// before the sale opens (Coordinator.Prepare), and last the physical limit at 64 puts a transaction (last, so
// that its million keys at most do not weigh on the sale rows' etcd).
func DefaultSaleShapes() []SaleShape {
	return []SaleShape{
		{Name: "storm", SKUs: 1, Stock: DefaultStormStock},
		{Name: "zero", SKUs: 1, Stock: 0},
		{Name: "storm-release", SKUs: 1, Stock: DefaultStormStock, Release: DefaultSaleRelease},
		{Name: "one", SKUs: 1, Stock: Plenty},
		{Name: "many", SKUs: DefaultSaleSKUs, Stock: Plenty},
		{Name: "many-skewed", SKUs: DefaultSaleSKUs, Stock: Plenty, Skew: DefaultSaleSkew},
		{Name: "many-10k", SKUs: DefaultSaleSKUsLarge, Stock: Plenty},
		{Name: "many-prepared", SKUs: DefaultSaleSKUs, Stock: Plenty, Prepare: true},
		{Name: "many-10k-prepared", SKUs: DefaultSaleSKUsLarge, Stock: Plenty, Prepare: true},
		{Name: "cart", SKUs: DefaultSaleSKUs, Stock: Plenty, Lines: DefaultCartLines},
		{Name: "cart-mix", SKUs: DefaultCartMixSKUs, Stock: Plenty, Lines: DefaultCartLines, CartShare: DefaultCartMixShare},
		LimitShape(DefaultLimitBatch),
	}
}

// OptionalSaleShapes are the shapes run only when named (--sale-shapes):
// the physical limit at smaller batches, 1, 4 and 18 puts a transaction.
func OptionalSaleShapes() []SaleShape {
	return []SaleShape{LimitShape(1), LimitShape(4), LimitShape(18)}
}

// SelectSaleShapes returns the shapes named in names (a comma-separated
// list; empty: all), in the order of shapes.
func SelectSaleShapes(shapes []SaleShape, names string) ([]SaleShape, error) {
	if strings.TrimSpace(names) == "" {
		return shapes, nil
	}
	var known []string
	for _, s := range shapes {
		known = append(known, s.Name)
	}
	var out []SaleShape
	for _, n := range strings.Split(names, ",") {
		n = strings.TrimSpace(n)
		i := -1
		for j, s := range shapes {
			if s.Name == n {
				i = j
			}
		}
		if i < 0 {
			return nil, fmt.Errorf("%w: sale shape %q (available: %s)", ErrInvalidConfig, n, strings.Join(known, ", "))
		}
		out = append(out, shapes[i])
	}
	return out, nil
}

// SaleStrategy is a way of selling many SKUs, set up for one run.
type SaleStrategy interface {
	// Setup creates p.Shape.SKUs SKUs of p.Shape.Stock units each.
	Setup(ctx context.Context, p SaleParams) error
	// Order takes 1 unit of SKU sku for order. A refusal is served false
	// with a nil error (and, when known, the revision and remaining stock
	// it was judged at); a retry under the same order ID must not take
	// again.
	Order(ctx context.Context, process, sku int, order string) (OrderOutcome, error)
	// Release gives back a served order's unit.
	Release(ctx context.Context, process, sku int, order string) error
	// Verify reads the books of every SKU after the run.
	Verify(ctx context.Context) (SaleBooks, error)
	Teardown(ctx context.Context) error
}

// OrderOutcome is what one order came to.
type OrderOutcome struct {
	Served bool
	// Revision and Remaining: where a refusal was judged (etcd strategies).
	Revision, Remaining int64
	// Line is a refused cart's line that could not be served (an index
	// into OrderCart's skus).
	Line int
}

// CartStrategy is a SaleStrategy that takes carts: 1 unit of each of
// skus (distinct) for order, all or none. A refusal is served false with a
// nil error and, when known, the refused line, its revision and what its
// SKU held; a retry under the same order ID must not take again.
type CartStrategy interface {
	OrderCart(ctx context.Context, process int, skus []int, order string) (OrderOutcome, error)
}

// SalePreparer is a SaleStrategy that can ready its processes for every
// SKU before a sale opens (the shapes with Prepare): stockctl's
// Coordinator.Prepare in each process.
type SalePreparer interface {
	Prepare(ctx context.Context) error
}

// truthChecker is a SaleStrategy that can say at which revision an order
// started and what a SKU held at a revision, so that refusals are checked.
type truthChecker interface {
	// Now is the store's current revision (a linearizable read).
	Now(ctx context.Context, process int) (int64, error)
	// RemainingAt is what SKU sku held in all at revision rev.
	RemainingAt(ctx context.Context, sku int, rev int64) (int64, error)
}

// skuTruthChecker is a truthChecker whose revisions are a SKU's (its
// cluster's, over several clusters): Now of the cluster that holds sku.
type skuTruthChecker interface {
	NowOf(ctx context.Context, process, sku int) (int64, error)
	RemainingAt(ctx context.Context, sku int, rev int64) (int64, error)
}

// SaleParams is what a sale strategy is set up with.
type SaleParams struct {
	Run       string
	Shape     SaleShape
	Segments  int
	Processes int
	Etcd      []*clientv3.Client
	Prefix    string
	// Clusters are the run's etcd clusters, for a strategy over several
	// (StockctlClustersSale); Etcd is the first's clients.
	Clusters []SaleCluster
}

// SaleBooks are the books of all SKUs of a run.
type SaleBooks struct {
	// Sold is, per SKU, the units held by active orders; Stock its total.
	Sold, Stock []int64
	Problems    []string
}

// SaleSpec describes a sale strategy.
type SaleSpec struct {
	Name  string
	Title string
	New   func() SaleStrategy
}

// SKUName names SKU i of a run.
func SKUName(i int) string { return "sku-" + strconv.Itoa(i) }

// skuPicker draws the SKU of each order: uniform, or Zipf with exponent s.
type skuPicker struct {
	n   int
	cdf []float64 // Zipf only
}

func newSKUPicker(n int, s float64) *skuPicker {
	p := &skuPicker{n: n}
	if s > 0 && n > 1 {
		p.cdf = make([]float64, n)
		sum := 0.0
		for k := range n {
			sum += 1 / math.Pow(float64(k+1), s)
			p.cdf[k] = sum
		}
		for k := range p.cdf {
			p.cdf[k] /= sum
		}
	}
	return p
}

func (p *skuPicker) pick(r *rand.Rand) int {
	if p.cdf == nil {
		return r.IntN(p.n)
	}
	x := r.Float64()
	lo, hi := 0, len(p.cdf)-1
	for lo < hi {
		mid := (lo + hi) / 2
		if p.cdf[mid] < x {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo
}

// redisSale is the sale constructor registered by the benchredis module.
var redisSale struct {
	mu  sync.Mutex
	new func(addr string) ([]SaleSpec, error)
}

// RegisterRedisSale makes the Redis peers' sale strategies available to
// RedisSaleSpecs (see RegisterRedis).
func RegisterRedisSale(f func(addr string) ([]SaleSpec, error)) {
	redisSale.mu.Lock()
	defer redisSale.mu.Unlock()
	redisSale.new = f
}

// RedisSaleSpecs returns the Redis peers' sale strategies, or ErrNoRedis.
func RedisSaleSpecs(addr string) ([]SaleSpec, error) {
	redisSale.mu.Lock()
	f := redisSale.new
	redisSale.mu.Unlock()
	if f == nil {
		return nil, ErrNoRedis
	}
	return f(addr)
}

// SelectSale returns the sale specs named in names (all when empty).
func SelectSale(specs []SaleSpec, names []string) ([]SaleSpec, error) {
	if len(names) == 0 {
		return specs, nil
	}
	var out []SaleSpec
	for _, n := range names {
		found := false
		for _, s := range specs {
			if s.Name == n {
				out, found = append(out, s), true
			}
		}
		if !found {
			var known []string
			for _, s := range specs {
				known = append(known, s.Name)
			}
			return nil, fmt.Errorf("%w %q (sale strategies: %s)", ErrUnknownStrategy, n, strings.Join(known, ", "))
		}
	}
	return out, nil
}
