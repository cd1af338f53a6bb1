#!/bin/sh
# make test's check of the browser client's types (api/web/client.d.ts):
# tsc --strict, without emitting, on example.ts, which imports the client as
# a vendored package (package.json, client.js and client.d.ts copied into
# node_modules/@relayhq/client of a temporary directory, as npm would lay it
# out) and uses every declaration. tsc comes from $TSC, else from PATH (.ci/run
# installs TypeScript 5 from the npm registry and puts it there). Without tsc
# the check is skipped with a message, except under CI, where it fails.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
web=$(dirname "$here")
tsc=${TSC:-$(command -v tsc || true)}
if [ -z "$tsc" ]; then
  if [ -n "${CI:-}" ]; then
    echo "client types: tsc not found, and CI is set: .ci/run should have installed TypeScript (npm install typescript@5)" >&2
    exit 1
  fi
  echo "client types: SKIPPED, tsc not found (npm install -g typescript@5, or set TSC=/path/to/tsc; CI runs it)"
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pkg="$tmp/node_modules/@relayhq/client"
mkdir -p "$pkg"
cp "$web/package.json" "$web/client.js" "$web/client.d.ts" "$pkg/"
cp "$here/example.ts" "$here/tsconfig.json" "$tmp/"
echo "client types: $("$tsc" --version) --strict on api/web/typecheck/example.ts"
(cd "$tmp" && "$tsc" -p tsconfig.json) # errors name example.ts and node_modules/@relayhq/client/client.d.ts
echo "client types: ok"
