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
//
// # An etcd we did not build
//
// The embedded members run the etcd server of our own go.mod. NewExternal
// runs a released etcd binary instead, as a child process, so that tests can
// check stockctl against the servers people actually deploy; by default that
// is Debian's etcd-server package (etcd 3.4). The binary is STOCKCTL_ETCD_BIN,
// else "etcd" on PATH. Without one, NewExternal installs etcd-server with
// apt-get when it runs as root (once per test binary, serialised across test
// binaries by a file lock in os.TempDir(); STOCKCTL_ETCD_INSTALL=0 forbids
// it), and otherwise skips the test, saying what to install or set. The
// server gets free loopback ports and a data dir in t.TempDir(), writes its
// log to a file there (shown only when it fails to start), and is stopped by
// SIGTERM, then SIGKILL, at cleanup; on Linux the kernel also kills it if
// the test binary dies first. External.Version says which release it is.
package etcdtest
