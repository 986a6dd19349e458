package etcdtest

import "google.golang.org/grpc"

// Option configures NewSingle and NewCluster.
type Option func(*options)

type options struct {
	noFsync     bool
	grpcOptions []grpc.ServerOption
	quota       int64
	maxTxnOps   uint
}

// WithNoFsync turns off fsync in the members. Tests get faster, and a crash
// of the test process could lose writes, which tests do not care about.
func WithNoFsync() Option {
	return func(o *options) { o.noFsync = true }
}

// WithGRPCServerOptions adds options to the members' client gRPC servers,
// e.g. an interceptor that injects the answers of another etcd version into
// real traffic.
func WithGRPCServerOptions(opts ...grpc.ServerOption) Option {
	return func(o *options) { o.grpcOptions = append(o.grpcOptions, opts...) }
}

// WithQuotaBackendBytes sets the members' database quota: beyond it etcd
// raises NOSPACE and refuses every write, as a full production etcd does.
func WithQuotaBackendBytes(n int64) Option {
	return func(o *options) { o.quota = n }
}

// WithMaxTxnOps sets the members' --max-txn-ops (etcd's default: 128).
func WithMaxTxnOps(n uint) Option {
	return func(o *options) { o.maxTxnOps = n }
}

func buildOptions(opts []Option) options {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	return o
}
