#!/usr/bin/env bash
# The project's test command: installs the test-only client packages (the
# official `openai` npm package the server tests drive), then runs every Go
# test.
set -euo pipefail
cd "$(dirname "$0")/.."

client=server/testdata/openai-client
if [ -f "$client/package.json" ] && command -v npm >/dev/null 2>&1; then
  if [ ! -d "$client/node_modules/openai" ]; then
    (cd "$client" && npm ci --no-audit --no-fund --loglevel=error)
  fi
fi

go test "$@" ./...
