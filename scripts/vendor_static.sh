#!/usr/bin/env bash
# Vendors the project's front-end libraries into static/vendor/<name>-<version>/ (with their licence) from the npm
# registry, at pinned versions checked against the registry's published integrity hash. The result is
# checked in, so neither CI nor a fresh machine needs npm or a network; run this (make vendor) only to
# change a version. The machines that serve the dashboard are offline: no CDN.
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=static/vendor

# name version integrity files-to-keep (paths inside the package)
vendor() {
  local name=$1 version=$2 integrity=$3; shift 3
  local work; work=$(mktemp -d)
  (cd "$work" && npm pack --silent "$name@$version" >/dev/null)
  local tarball; tarball=$(ls "$work"/*.tgz)
  local actual="sha512-$(openssl dgst -sha512 -binary "$tarball" | base64 -w0)"
  if [[ "$actual" != "$integrity" ]]; then
    echo "integrity mismatch for $name@$version: $actual" >&2; exit 1
  fi
  tar -xzf "$tarball" -C "$work"
  local out="$DEST/$name-$version"
  rm -rf "$DEST/$name"-*; mkdir -p "$out"
  for f in "$@"; do cp "$work/package/$f" "$out/"; done
  rm -rf "$work"
  echo "vendored $name@$version into $out"
}

vendor uplot 1.6.32 'sha512-KIMVnG68zvu5XXUbC4LQEPnhwOxBuLyW1AHtpm6IKTXImkbLgkMy+jabjLgSLMasNuGGzQm/ep3tOkyTxpiQIw==' \
  dist/uPlot.iife.min.js dist/uPlot.min.css LICENSE
