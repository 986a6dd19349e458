// Package engines lets the module's own packages (the rebalancer, the CLI,
// tests) reach what a coordinator.Coordinator is built of, which its public
// API does not export: the etcd client and key space, the lock engine and
// the segment engine.
//
// Package coordinator sets Of when it is initialised; a package that needs
// it imports coordinator anyway (it holds a *coordinator.Coordinator).
package engines

import (
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/internal/keys"
	"github.com/stockctl/stockctl/internal/lock"
	"github.com/stockctl/stockctl/segments"
)

// Engines is what one coordinator is made of.
type Engines struct {
	Client *clientv3.Client
	// KV is Client's KV through etcdcall: no call made through it sends its
	// caller's deadline to the server.
	KV    clientv3.KV
	Keys  keys.Space
	Locks *lock.Engine
	Stock *segments.Engine
}

// Of returns the engines of c, a *coordinator.Coordinator (any, so that
// this package need not import coordinator). It panics on anything else.
var Of func(c any) Engines
