// Package segments is stockctl's segment logic: the data model of segmented
// stock and the engine that sells from it.
//
// # The model
//
// What a SKU's meta record, counters and order records hold, how they are
// encoded in etcd (encoding.go), how requests are routed to segments
// (route.go), which inputs are valid (validate.go), and the results and
// errors of the stock operations (results.go, errors.go). This part does no
// I/O; internal/keys says where each value lives.
//
// Every value is JSON with a version field "v" (currently 1) and is decoded
// strictly: unknown fields, a missing or different version, trailing data or
// out-of-range numbers are errors, reported as a *CorruptError naming the key.
// A counter is exactly {"v":1,"n":<non-negative integer>}.
//
// Route maps a route key (a user ID, a session ID...) to a segment with the
// 64-bit FNV-1a hash of its bytes, modulo the segment count. The function is
// part of the format: the same key goes to the same segment in every process
// and every version.
//
// # The engine
//
// Engine is what coordinator.Coordinator's stock operations run on; a
// service uses it through the coordinator, which builds one per process.
// An order goes one way, through four files: coordinator/stock.go, then
// sell.go (Engine.Allocate and the ladder, from the segments this process
// holds, a segment sold directly without its lock, down to the whole SKU),
// committer.go (its deduction committed with the process's other orders in
// one fenced transaction: one committer for held and direct places, each
// with its fence) and commitplan.go (each place's plan and its part of the
// transaction). The rungs' helpers are beside them: seller.go, slots.go,
// pull.go, grow.go, share.go (the fair share), look.go and snapshot.go,
// gather.go, lookwait.go (rung 5's waits end when a look sees too little);
// the business step runs in one place (step.go); buyers' limits
// (users.go); the places' caches (placecache.go, directcache.go,
// heldplace.go). Around it: SKU creation and
// restock (create.go), moves between the pool and segments (moves.go),
// returns (returns.go), reservations, confirms and expiry (reserve.go,
// confirmer.go, expire_batch.go), orders of several SKUs, all lines or none
// in one transaction, committed with the other carts of the moment, and
// their whole-order returns and confirms (cart.go, cartbatch.go,
// cartreturn.go), the books (status.go) and metrics (metrics.go).
// docs/architecture.md draws the whole path.
package segments
