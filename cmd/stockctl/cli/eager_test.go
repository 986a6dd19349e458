package cli

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Lazy segments are the default; --eager-segments (for processes beside a
// stockctl too old to read lazy counters) writes a segment's counter with
// each direct order and nothing after. By default the first order's commit
// takes its segment over (the counter names the process) and the process's
// Close settles it (written exact again): one write more, and the counter
// is exact once the command has exited, either way.
func TestEagerSegmentsFlag(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		flags  []string
		writes int64 // the counter's writes by one allocate
	}{
		{name: "lazy by default", writes: 2},
		{name: "eager", flags: []string{"--eager-segments"}, writes: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			e.ok("init", "flag", "--total", "10", "--segments", "1")
			version := func() (int64, string) {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				resp, err := shared.client.Get(ctx, e.prefix+"stock/flag/seg/", clientv3.WithPrefix())
				if err != nil || len(resp.Kvs) != 1 {
					t.Fatalf("the segment counter: %v, %v", resp, err)
				}
				return resp.Kvs[0].Version, string(resp.Kvs[0].Value)
			}
			before, _ := version()
			e.ok(append(tc.flags, "allocate", "flag", "--order", "o-1", "--qty", "1")...)
			after, value := version()
			if after-before != tc.writes {
				t.Fatalf("one allocate wrote the segment's counter %d times (now %s), want %d", after-before, value, tc.writes)
			}
		})
	}
}
