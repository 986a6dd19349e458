package etcdtest

import (
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Rewrite puts key's value back as it is: the same value at a new
// ModRevision, as a writer behind a process's back would leave it (a
// process that compares the key's revision is refused). The key must
// exist.
func Rewrite(t testing.TB, cli *clientv3.Client, key string) {
	t.Helper()
	resp, err := cli.Get(t.Context(), key)
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("read %s: %v (%d keys)", key, err, len(resp.Kvs))
	}
	if _, err := cli.Put(t.Context(), key, string(resp.Kvs[0].Value)); err != nil {
		t.Fatalf("rewrite %s: %v", key, err)
	}
}
