// Package api holds stockctl's protobuf API: the package stockctl.v1 in
// stockctl/v1/*.proto, and the Go code generated from it (stockctl/v1 for the
// messages, stockctl/v1/stockctlv1connect for Connect clients and handlers).
// The service package serves it; docs/api.md documents it for callers.
//
// The generated code is committed. After changing a .proto file, regenerate
// it with
//
//	go generate ./api/...
//
// which runs scripts/gen-proto.sh: buf (lint, format check, generate) and the
// two code generators, each a pinned Go module run with `go run`.
package api

//go:generate bash ../scripts/gen-proto.sh
