package etcdtest

// Option configures NewSingle and NewCluster.
type Option func(*options)

type options struct {
	noFsync bool
}

// WithNoFsync turns off fsync in the members. Tests get faster, and a crash
// of the test process could lose writes, which tests do not care about.
func WithNoFsync() Option {
	return func(o *options) { o.noFsync = true }
}

func buildOptions(opts []Option) options {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	return o
}
