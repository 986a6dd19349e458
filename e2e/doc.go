// Package e2e is stockctl's reliability suite: each test runs real embedded
// etcd (no mocks), injects a fault instead of waiting for one, states the
// invariant it checks and fails when it breaks.
//
//	paused_test.go     a holder frozen past its lease (Jepsen's scenario), fenced and unfenced
//	killed_test.go     a separate OS process SIGKILLed while holding segment locks
//	serve_killed_test.go one of two `stockctl serve` processes SIGKILLed mid-sale, its buyers
//	                   retrying through the other (the built binary, gRPC clients)
//	failover_test.go   the etcd leader stopped and restarted during a sale (3 members)
//	partition_test.go  a client cut off from etcd by a blackholed proxy
//	rebalancer_test.go the leading rebalancer's process killed or lease revoked mid-sale
//	retries_test.go    allocations whose reply is lost, retried under their order ID
//	linear_test.go     a porcupine model of one SKU, checked on histories of the above
//	deploy_recipe_test.go scripts/deploy-recipe.sh, docs/deploy.md's recipe on loopback (TLS etcd
//	                   with auth, serve, HAProxy when installed), and the page quoting it as it is
//	lockhistory_test.go read-write locks and semaphores: holders replayed per revision
//	                   under a paused holder, a killed process and a partition
//
// The separate OS processes are this package's test binary re-executed in a
// helper mode (see helper_test.go), and, for the API, the stockctl binary
// built from this tree (serve_proc_test.go). Every load loop
// is bounded in count and time and talks to 127.0.0.1 only.
//
// Run it with:
//
//	go test -race -count=1 -v ./e2e/
//
// docs/reliability.md lists the scenarios, their invariants and the figures
// of a run.
package e2e
