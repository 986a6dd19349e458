// Package redispeers is what users would otherwise pick for a hot SKU on
// Redis, as strategies of stockctl bench: a redsync lock per segment around
// a read-check-deduct with the business step, and a Lua "decrement if
// enough" on one key.
//
// It lives in its own module (benchredis) so that the Redis client libraries
// never enter the main module's go.mod or the library's import graph. The
// module's binary, stockctl-bench, is stockctl with these strategies
// registered: stockctl-bench bench --redis 127.0.0.1:PORT.
package redispeers
