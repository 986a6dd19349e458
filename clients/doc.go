// Package clients holds stockctl's clients for other languages: python/ (the
// stockctl-client package) and java/ (a Maven module). It has no Go code of
// its own: its tests (clients_test.go) build stockctl, start real `stockctl
// serve` processes on loopback over an embedded etcd, and run each client's
// own test suite and the programs of docs/api.md against them, so that
// `go test ./...` covers the clients too.
package clients
