#!/usr/bin/env bash
# Regenerates the committed Python stubs of this package from the API's
# .proto files (../../api/stockctl/v1) and ../proto/stockctl_client/rpc.proto:
# the messages (and .pyi type stubs) with protoc >= 3.20 (Debian's
# protobuf-compiler; grpc_tools' own protoc is 3.6 on Debian 12, and its
# old-style code fails on the protobuf runtimes pip installs), the gRPC
# stubs with grpc_tools' plugin (python3-grpc-tools or pip's grpcio-tools).
# Run it after changing a .proto file; the Go test
# clients/TestPythonStubsFresh fails while they are stale.
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-/usr/bin/python3}
PROTOC=${PROTOC:-protoc}
OUT=${OUT:-src}   # the Go test generates into a temp dir and compares
rm -f "$OUT"/stockctl/v1/*_pb2*.py* "$OUT"/stockctl_client/rpc_pb2.py*
mkdir -p "$OUT"/stockctl/v1 "$OUT"/stockctl_client
"$PROTOC" -I ../../api --python_out="$OUT" --pyi_out="$OUT" ../../api/stockctl/v1/*.proto
"$PYTHON" -m grpc_tools.protoc -I ../../api --grpc_python_out="$OUT" ../../api/stockctl/v1/*.proto
"$PROTOC" -I ../proto --python_out="$OUT" --pyi_out="$OUT" ../proto/stockctl_client/rpc.proto
