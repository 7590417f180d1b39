#!/usr/bin/env bash
# The project's test command: installs the test-only client packages (the
# official `openai` npm package and `ws`, for its realtime client, which the
# server tests drive), then runs every Go test.
set -euo pipefail
cd "$(dirname "$0")/.."

client=server/testdata/openai-client
if [ -f "$client/package.json" ] && command -v npm >/dev/null 2>&1; then
  if [ ! -d "$client/node_modules/openai" ] || [ ! -d "$client/node_modules/ws" ]; then
    (cd "$client" && npm ci --no-audit --no-fund --loglevel=error)
  fi
fi

go test "$@" ./...

# Real audio I/O against a private PulseAudio server (build tag "pulse"):
# run when pulseaudio is installed (.ci/run installs it).
if command -v pulseaudio >/dev/null 2>&1; then
  go test "$@" -tags pulse ./audio/device ./pipeline/live
else
  echo "scripts/test.sh: pulseaudio not installed: the -tags pulse device tests were not run" >&2
fi
