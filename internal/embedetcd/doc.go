// Package embedetcd starts an etcd member inside the current process.
//
// stockctl runs its own etcd rather than depending on an external cluster, so
// this package owns the parts of that which are easy to get wrong:
//
//   - Exclusive use of a data directory. Two etcd processes on one data dir
//     would corrupt it, and bbolt's own file lock makes the second one block
//     forever instead of failing. Start therefore takes a non-blocking flock on
//     <Dir>/stockctl.lock first and fails at once with ErrDataDirInUse.
//   - Bounded startup. Start waits for the member to be ready, but gives up on
//     the ready timeout, on ctx cancellation, or as soon as etcd reports an
//     error or stops, and cleans up after itself in every case.
//   - Free ports. ":0" works for the client and (single member) peer address;
//     the port is chosen before etcd starts so that the URLs etcd advertises to
//     its cluster and to clients are real ones, not ":0".
//   - Loopback by default. Non-loopback addresses must be asked for
//     explicitly with Config.AllowNonLoopback.
//   - Optional TLS for clients (Config.CertFile and friends): the member then
//     serves https, and can require client certificates.
//   - Quiet logs. etcd logs to stderr at level "error" unless told otherwise,
//     and writes nothing outside Dir.
package embedetcd
