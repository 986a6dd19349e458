// Package segments is the data model of segmented stock: what a SKU's meta
// record, counters and order records hold, how they are encoded in etcd, how
// requests are routed to segments, and which inputs are valid.
//
// It does no I/O. The coordinator package reads and writes these values; the
// internal/keys package says where they live.
//
// # Encoding
//
// Every value is JSON with a version field "v" (currently 1) and is decoded
// strictly: unknown fields, a missing or different version, trailing data or
// out-of-range numbers are errors, reported as a *CorruptError naming the key.
// A counter is exactly {"v":1,"n":<non-negative integer>}.
//
// # Routing
//
// Route maps a route key (a user ID, a session ID...) to a segment with the
// 64-bit FNV-1a hash of its bytes, modulo the segment count. The function is
// part of the format: the same key goes to the same segment in every process
// and every version.
package segments
