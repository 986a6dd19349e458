// Package sale runs a flash sale against stockctl: concurrent buyers placing
// orders until they are told the stock is sold out. stockctl's demo uses it,
// and a benchmark can reuse it with its own way of placing an order (Buy).
//
// Each buyer is a goroutine with its own user ID (the route key) and its own
// random quantities. It places orders with unique order IDs until a refusal
// for one unit tells it the SKU is sold out: a refusal for more than one unit
// is retried for one unit, since the last few units of a sale are usually
// spread too thinly for larger orders.
//
// An order that fails with any other error is retried under the same order
// ID: allocations are idempotent by order ID, so the retry either commits the
// order or reports that an earlier attempt already did (a replay), and the
// run's unit count stays exact. An order whose every attempt failed is
// counted as unresolved: its outcome is unknown.
//
// Every loop is bounded: by the stock (a sold-out SKU refuses everyone), by
// Config.MaxOrders, by Config.MaxDuration, by Config.MaxErrors and by the
// caller's ctx.
package sale
