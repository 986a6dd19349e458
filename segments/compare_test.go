package segments

import (
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"
)

// revisionIs builds what clientv3.Compare(target, "=", rev) builds.
func TestRevisionIsBuildsClientv3sCompare(t *testing.T) {
	tests := []struct {
		name   string
		target func(key string) clientv3.Cmp
		rev    int64
	}{
		{"created, absent", clientv3.CreateRevision, 0},
		{"created at", clientv3.CreateRevision, 42},
		{"modified at", clientv3.ModRevision, 7},
		{"modified, absent", clientv3.ModRevision, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			want := clientv3.Compare(tc.target("/k"), "=", tc.rev)
			got := revisionIs(tc.target("/k"), tc.rev)
			if !proto.Equal(got.GetCompare(), want.GetCompare()) {
				t.Errorf("revisionIs = %v; want %v", got.GetCompare(), want.GetCompare())
			}
		})
	}
	t.Run("a value compare", func(t *testing.T) {
		defer func() {
			if recover() == nil {
				t.Error("revisionIs took a value compare; want a panic")
			}
		}()
		revisionIs(clientv3.Value("/k"), 1)
	})
}
