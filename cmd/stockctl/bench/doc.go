// Package bench measures ways of selling one hot SKU against each other,
// under the same load, in one run: stockctl bench.
//
// A Strategy is one way of taking stock for an order (one etcd lock around
// the whole stock, a stock concurrency.Mutex per segment, stockctl's
// segmented coordinator, and, from the benchredis module, redsync and a Redis
// Lua script). Run sets each strategy up afresh for each shape (a segment
// count and a buyer count), drives it with cmd/stockctl/sale's closed-loop
// buyers for a bounded time and order count, and then checks its books:
// what the buyers were served, what the strategy recorded, and what its
// counters still hold must add up, and nothing may be oversold. stockctl's
// runs also time its refills with a RefillObserver, and Targets judges the
// rows against the project's targets.
//
// Buyers are spread evenly over the segments (buyer b's route key is chosen
// so that it routes to segment b mod N) and over the "processes" (etcd clients
// or coordinators), so that every segment has the same number of buyers and
// a segment's buyers sit in different processes. With a business step of s
// and N places that can each serve one order at a time, the ideal is N/s
// orders per second; every strategy's rate is reported against it.
//
// RunSale runs the sale shapes (SaleShape: sell-out storms, one SKU, 1,000
// and 10,000 SKUs) and the physical limit (the limit-N shapes: etcd alone,
// order-sized puts of new keys, N a transaction); every row says what a
// served order cost etcd, by etcd's own counters (EtcdServerMetrics) and
// by the clients' (EtcdCounter).
//
// Nothing here mocks etcd or Redis: strategies talk to real servers, on
// loopback.
package bench
