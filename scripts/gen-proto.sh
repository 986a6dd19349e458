#!/usr/bin/env bash
# Lints the protobuf API under api/ and regenerates its Go code
# (api/stockctl/v1/*.pb.go and api/stockctl/v1/stockctlv1connect/).
#
# Everything is a pinned Go module built by `go run` (buf, protoc-gen-go,
# protoc-gen-connect-go: versions below and in api/buf.gen.yaml), so Go is
# all it needs. Run it as `go generate ./api/...` or directly. The result is
# committed; CI does not run this.
set -euo pipefail

BUF_VERSION=v1.75.0

cd "$(dirname "$0")/../api"
buf() { go run "github.com/bufbuild/buf/cmd/buf@${BUF_VERSION}" "$@"; }

buf format --diff --exit-code
buf lint
rm -f stockctl/v1/*.pb.go stockctl/v1/stockctlv1connect/*.connect.go
buf generate
gofmt -l stockctl/ | (! grep .) || { echo "generated code is not gofmt-clean" >&2; exit 1; }
