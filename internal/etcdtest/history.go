package etcdtest

import (
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// KeysPut returns the keys under prefix that revisions from+1 to to put,
// as etcd's history has them (a key put twice is listed twice), read one
// revision at a time: it ends whatever those revisions wrote elsewhere.
// The revisions must not have been compacted.
func KeysPut(tb testing.TB, client *clientv3.Client, prefix string, from, to int64) []string {
	tb.Helper()
	var keys []string
	for rev := from + 1; rev <= to; rev++ {
		resp, err := client.Get(tb.Context(), prefix, clientv3.WithPrefix(), clientv3.WithRev(rev),
			clientv3.WithMinModRev(rev), clientv3.WithKeysOnly())
		if err != nil {
			tb.Fatalf("read revision %d: %v", rev, err)
		}
		for _, kv := range resp.Kvs {
			keys = append(keys, string(kv.Key))
		}
	}
	return keys
}
