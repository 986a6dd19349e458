// Package etcdtest gives tests real embedded etcd members to talk to: a single
// member (NewSingle), an n-member cluster (NewCluster), and a fault-injecting
// TCP proxy in front of an endpoint (NewProxy).
//
// Everything runs on 127.0.0.1, keeps its data in t.TempDir(), and is stopped
// by t.Cleanup even when the test fails half way. Members can be stopped and
// restarted on the same data dir and the same ports, so clients created
// before a restart keep working after it (once gRPC has reconnected, which
// takes up to a few seconds of backoff: retry with a bounded loop).
//
// Startup, restart and leader waits are bounded; a helper that runs out of
// time fails the test with t.Fatal, so call them from the test goroutine.
package etcdtest
