// Package etcdcall makes the end of a caller's time budget recognisable in
// the outcome of an etcd call, whatever the server answers.
//
// A ctx deadline is sent to the server with every gRPC call, and the server
// enforces it too. An etcd 3.4 server answers a call whose deadline passed
// with an error of its own ("rpc error: code = Unknown desc = context
// deadline exceeded", or "etcdserver: request timed out" for a write), and
// that answer can reach the client before the client's own timer marks the
// ctx done (on a loaded machine the timer fires late). The etcd client then
// reports the server's error as is, and a caller that asks "did my budget
// run out?" with ctx.Err() is told no.
//
// So stockctl never sends a budget to the server:
//
//   - Budget is a timeout that ends by cancellation: no deadline travels with
//     the calls made under it, and its end is the cause the caller chose
//     (for a lock wait, ErrLocked).
//   - KV wraps a client's KV so that each call runs under a copy of the
//     caller's ctx without its deadline, cancelled when the caller's ctx
//     ends; its errors go through Err.
//   - Err turns a server's report of a deadline into the caller's ctx's end
//     when that deadline has passed: for calls that must carry a deadline
//     (those made by etcd's own packages, such as concurrency.Election).
package etcdcall
