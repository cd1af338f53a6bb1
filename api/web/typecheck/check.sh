#!/bin/sh
# make test's check of the browser client as a package (api/web/package.json):
# `npm pack` in api/web (its prepack and postpack scripts included), the
# tarball installed with npm into a temporary project (no registry needed:
# the package has no dependencies), and tsc --strict, without emitting, on
# example.ts, which imports @relayhq/client from there and uses every
# declaration of client.d.ts. tsc comes from $TSC, else from PATH (.ci/run
# installs TypeScript 5 from the npm registry and puts it there). Without
# tsc or npm the check is skipped with a message, except under CI, where it
# fails.
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
if ! command -v npm >/dev/null 2>&1; then
  if [ -n "${CI:-}" ]; then
    echo "client package: npm not found, and CI is set: .ci/run should have installed it" >&2
    exit 1
  fi
  echo "client package: SKIPPED, npm not found (CI runs it)"
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
npmq="--no-audit --no-fund --loglevel=error"
packed=$(cd "$web" && npm pack $npmq --pack-destination "$tmp") # set -e: a failed pack stops here
tarball=$(printf '%s\n' "$packed" | tail -1)
listing=$(tar -tzf "$tmp/$tarball" | sort | tr '\n' ' ')
want="package/LICENSE package/README.md package/client.d.ts package/client.js package/package.json "
if [ "$listing" != "$want" ]; then
  echo "client package: $tarball holds $listing; want $want" >&2
  exit 1
fi
if [ -e "$web/LICENSE" ]; then
  echo "client package: npm pack left api/web/LICENSE behind (postpack)" >&2
  exit 1
fi
mkdir "$tmp/app"
cp "$here/example.ts" "$here/tsconfig.json" "$tmp/app/"
(cd "$tmp/app" && echo '{"name":"example","private":true,"type":"module"}' > package.json &&
  npm install $npmq --no-package-lock --offline "$tmp/$tarball")
echo "client package: $tarball installed; $("$tsc" --version) --strict on api/web/typecheck/example.ts"
(cd "$tmp/app" && "$tsc" -p tsconfig.json) # errors name example.ts and node_modules/@relayhq/client/client.d.ts
echo "client package: ok"
