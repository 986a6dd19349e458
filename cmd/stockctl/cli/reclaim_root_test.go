package cli

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestReclaimNeedsRoot: etcd's refusals of reclaim's steps to a user whose
// role is limited to the prefix (as etcd 3.4 and later answer them) come out
// saying reclaim needs the root user and how to run it as root; other errors
// are left alone. scripts/deploy-recipe.sh (TestDeployRecipe) checks it
// against a real etcd with authentication.
func TestReclaimNeedsRoot(t *testing.T) {
	denied := []error{
		status.Error(codes.Unknown, "auth: permission denied"), // etcd 3.4's defragment
		rpctypes.ErrPermissionDenied,
		rpctypes.ErrGRPCPermissionDenied,
		fmt.Errorf("wrapped: %w", status.Error(codes.PermissionDenied, "etcdserver: permission denied")),
	}
	for _, err := range denied {
		got := failed(nil, "defragment https://127.0.0.1:2379", needsRoot(err))
		msg := got.Error()
		for _, want := range []string{"permission denied", "root user", "--user root:", "CN is root", "docs/operations.md"} {
			if !strings.Contains(msg, want) {
				t.Errorf("%v: %q lacks %q", err, msg, want)
			}
		}
	}
	other := errors.New("context deadline exceeded")
	if got := needsRoot(other); got != other {
		t.Errorf("needsRoot(%v) = %v, want it unchanged", other, got)
	}
}
