#!/usr/bin/env bash
# Builds the grpc-go quickstart offline, in GOPATH mode, from Debian's Go packages
# (examples/setup.sh installs them): generates the kibo.ctrl.v1 Go code with protoc into a
# private GOPATH under OUT, then `go build`s quickstart/ against it and /usr/share/gocode.
#
#   examples/go/build.sh [OUT]        # OUT defaults to examples/go/build; binary: OUT/quickstart
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
out="$(mkdir -p "${1:-$here/build}" && cd "${1:-$here/build}" && pwd)"

for tool in go protoc protoc-gen-go protoc-gen-go-grpc; do
  if ! command -v "$tool" >/dev/null; then
    echo "$tool is missing: run examples/setup.sh" >&2
    exit 1
  fi
done

gopath="$out/gopath"
rm -rf "$gopath/src/github.com/kibo-dev"
mkdir -p "$gopath/src"

# go_package in the kibo protos names the import path; google/rpc/status.proto maps to the
# genproto package Debian ships (golang-google-genproto-dev), so it is not generated here.
status_map="Mgoogle/rpc/status.proto=google.golang.org/genproto/googleapis/rpc/status"
protoc \
  -I "$repo/proto" \
  --go_out="$gopath/src" --go_opt="$status_map" \
  --go-grpc_out="$gopath/src" --go-grpc_opt="$status_map" \
  "$repo"/proto/kibo/ctrl/v1/*.proto

# go needs a build cache; without HOME (some CI shells) keep it beside the output.
export GOCACHE="${GOCACHE:-${XDG_CACHE_HOME:-${HOME:-$out}/.cache}/go-build}"
cd "$here/quickstart"
GO111MODULE=off GOPATH="$gopath:/usr/share/gocode" GOPROXY=off GOFLAGS= \
  go build -o "$out/quickstart" .
echo "built $out/quickstart"
