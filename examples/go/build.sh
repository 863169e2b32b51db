#!/usr/bin/env bash
# Builds the Go quickstart offline, in GOPATH mode, from Debian's Go packages
# (examples/setup.sh installs them), against the Go SDK in sdk/go (its generated code is
# committed there: gen/generate_go.py). sdk/go/go.sh sets up the private GOPATH under OUT.
#
#   examples/go/build.sh [OUT]        # OUT defaults to examples/go/build; binary: OUT/quickstart
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
out="$(mkdir -p "${1:-$here/build}" && cd "${1:-$here/build}" && pwd)"

KIBO_GOPATH="$out/gopath" KIBO_GO_DIR=examples/go/quickstart \
  "$repo/sdk/go/go.sh" build -o "$out/quickstart" .
echo "built $out/quickstart"
