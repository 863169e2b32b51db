#!/usr/bin/env bash
# Runs a go command on the Go SDK offline, in GOPATH mode, with Debian's Go packages
# (examples/setup.sh installs them; connect-go and the module proxy are not needed):
#
#   sdk/go/go.sh vet ./...
#   sdk/go/go.sh test ./...      # needs KIBO_SERVER (and KIBO_TOKEN) of a kibo-ctrl serve --runtime sim
#
# GOPATH mode needs the code under GOPATH/src/<import path>: a private GOPATH ($KIBO_GOPATH,
# else one under $TMPDIR per checkout) holds a symlink github.com/kibo-dev/kibo -> this
# checkout, so the module path github.com/kibo-dev/kibo/sdk/go resolves to sdk/go here.
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
for tool in go protoc-gen-go; do
  command -v "$tool" >/dev/null || { echo "$tool is missing: run examples/setup.sh" >&2; exit 1; }
done
gopath="${KIBO_GOPATH:-${TMPDIR:-/tmp}/kibo-gopath-$(printf %s "$repo" | md5sum | cut -c1-12)}"
mkdir -p "$gopath/src/github.com/kibo-dev"
link="$gopath/src/github.com/kibo-dev/kibo"
# A GOPATH left by an older build may hold a copy there instead of the link: it is ours, replace it.
if [ -e "$link" ] && [ ! -L "$link" ]; then rm -rf "$link"; fi
ln -sfn "$repo" "$link"
# go needs a build cache; without HOME (some CI shells) keep it beside the GOPATH.
export GOCACHE="${GOCACHE:-${XDG_CACHE_HOME:-${HOME:-$gopath}/.cache}/go-build}"
cd "$gopath/src/github.com/kibo-dev/kibo/${KIBO_GO_DIR:-sdk/go}"
GO111MODULE=off GOPATH="$gopath:/usr/share/gocode" GOPROXY=off GOFLAGS= exec go "$@"
