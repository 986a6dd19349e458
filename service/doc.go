// Package service is stockctl's network API: it serves the stockctl.v1
// StockService, LockService and InspectService (api/stockctl/v1) for a
// *coordinator.Coordinator, so that services in any language can sell stock
// and hold fenced locks through `stockctl serve`, and anyone can see who
// holds what (InspectService is read-only). With Config.Console it also
// serves the sale console's page under /console/ (package console).
//
// One http.Handler speaks gRPC, gRPC-Web and Connect (HTTP/1.1 or HTTP/2,
// JSON or binary protobuf) at POST /stockctl.v1.StockService/<Method>,
// /stockctl.v1.LockService/<Method> and /stockctl.v1.InspectService/<Method>,
// plus gRPC server reflection (v1 and
// v1alpha, for grpcurl) and grpc.health.v1 (for load balancers):
//
//	srv, err := service.New(coord, service.Config{Tokens: tokens, TLS: tlsConfig})
//	if err != nil { ... }
//	defer srv.Close()
//	ln, err := net.Listen("tcp", addr)
//	...
//	err = srv.Serve(ctx, ln) // until ctx ends; h2c (gRPC without TLS) when cfg.TLS is nil
//
// # Errors
//
// Every error a handler returns carries a gRPC code a client can branch on,
// a message for people and a google.rpc.ErrorInfo whose reason is one of
// stockctl.v1.ErrorReason's names (INSUFFICIENT_STOCK, ORDER_CONFLICT, ...),
// with typed details where they help (InsufficientStock with want, remaining
// and revision on a sold-out SKU). docs/api.md has the table.
//
// # Safety
//
//   - Authentication: with Config.Tokens, every call but the health check
//     needs "Authorization: Bearer <token>" (compared in constant time); a
//     credential in the URL's query is refused. TLS and client certificates
//     come with Config.TLS. CheckListen refuses a non-loopback address unless
//     TLS and client authentication are both configured.
//   - Load: at most Config.MaxInflight short calls and Config.MaxStreams long
//     ones (streams, lock acquisitions) run at once; beyond that a call is
//     refused at once with RESOURCE_EXHAUSTED (OVERLOADED), never queued.
//     Request messages are limited to Config.MaxBodyBytes.
//   - Deadlines: the client's deadline (grpc-timeout, Connect-Timeout-Ms)
//     bounds the work of its call. A call waits at most Config.EtcdWait for
//     an unreachable etcd before it fails with UNAVAILABLE.
//
// # Locks held for remote callers
//
// LockService lends the coordinator's named locks. A hold ends when the
// caller releases it, when the caller stops keeping it alive for its ttl, or
// when the server loses its etcd session; the caller is told (a `lost` event
// on the Hold stream, LOCK_LOST on KeepAlive and Release). Every hold of a
// name gets a larger fencing token than the previous one: the service never
// lets two of its callers share one etcd key of a lock, which the
// coordinator's local handoffs would otherwise do.
//
// Unary holds (Acquire, KeepAlive, Release) live in the server that granted
// them: a load balancer must send a hold's KeepAlive and Release to that
// server.
//
// # Metrics
//
// With Config.Registerer, these Prometheus metrics are registered:
//
//	stockctl_api_request_duration_seconds{method,code}  histogram: calls by method and gRPC code
//	                                                     (a stream's whole life); the count is the
//	                                                     number of calls
//	stockctl_api_rejected_total{reason}                  calls refused before a handler ran: overloaded,
//	                                                     body_too_large, token_missing, token_invalid,
//	                                                     token_in_url
//	stockctl_api_inflight_calls{kind}                    calls running now; kind short or long
//	stockctl_api_lock_holds{shape}                       locks held for remote callers; shape stream or lease
//
// method is the procedure without its leading slash
// ("stockctl.v1.StockService/Allocate"), or "unknown"; code is the gRPC
// code's name in snake case ("ok", "failed_precondition").
package service
