#!/usr/bin/env bash
# Installs what the tests need beyond pip (README.md's second command runs it):
#   - bubblewrap, the sandbox of the process runtime (tests/system/test_process_runtime.py);
#   - h2load (nghttp2-client), the benchmark's second opinion and its Connect figure;
#   - python3-venv, for `python3 -m venv` on Debian;
# and what the real-client tests (tests/system/test_real_clients.py) need:
#   - Go, grpc-go and protoc from Debian's packages (the Go example builds offline, GOPATH
#     mode), and curl;
#   - the Node example's packages from npm (examples/node/package-lock.json).
# buf itself comes from the repository root's package.json (`npm ci` at the root).
# Idempotent, and quick when everything is already there. Needs root (or sudo) for apt-get.
set -euo pipefail
cd "$(dirname "$0")"

PACKAGES=(
  bubblewrap
  e2fsprogs
  curl
  golang-go
  golang-google-grpc-dev
  golang-github-golang-protobuf-1-5-dev
  golang-google-protobuf-dev
  libseccomp2
  nghttp2-client
  nftables
  postgresql
  protobuf-compiler
  protoc-gen-go
  protoc-gen-go-grpc
  python3-venv
)

missing=()
for package in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$package")
  fi
done

if [ "${#missing[@]}" -gt 0 ]; then
  echo "examples/setup.sh: installing ${missing[*]}"
  sudo=()
  if [ "$(id -u)" -ne 0 ]; then sudo=(sudo); fi
  export DEBIAN_FRONTEND=noninteractive
  "${sudo[@]}" apt-get update -qq
  "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "examples/setup.sh: Debian packages already installed"
fi

# Node packages: `npm ci` again only when package-lock.json changed since the last one.
cd node
stamp=node_modules/.kibo-setup-lock.sha256
want="$(sha256sum package-lock.json | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ] || [ ! -x node_modules/.bin/protoc-gen-es ]; then
  echo "examples/setup.sh: npm ci in examples/node"
  npm ci --no-audit --no-fund --loglevel=error
  echo "$want" >"$stamp"
else
  echo "examples/setup.sh: examples/node/node_modules is up to date"
fi
