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

# The CUDA backend's kernel contract (every kernel against its float64
# replay, every planted fault caught) and its bit-identity tests, on the
# host emulator (gpu/cuda/cudaemu) where there is no GPU: it needs a C++17
# compiler (.ci/run installs g++). On a GPU machine the same tests run on
# the GPU in the plain `go test` above.
# Its first run on a machine compiles every planted fault's module with
# the host compiler (≈ 45 builds): on two cores that alone can pass go
# test's default 10-minute limit, so these runs get 30 (a later -timeout in
# the arguments still wins).
if command -v "${CXX:-g++}" >/dev/null 2>&1; then
  OMNIPIPE_CUDA_EMU=1 go test -timeout 30m "$@" ./gpu/cuda -run 'TestKernelContract|TestContractUnderShuffledSchedule|TestDeviceOpens|TestMatchesCPUBackend|TestFusedOpsEqualSeparate|TestMMAInvarianceMixedRows|TestGemvVariantsBitIdentical|TestMatMulTiledBitIdentical|TestNormFusedEqualsSeparate|TestRelPosFusedEqualsSeq|TestStdBlockEqualsSeq|TestShortConvGatedEqualsSeq|TestStdBlockPhasesReplay|TestMmvVariantsBitIdentical|TestMmaBigSplitBitIdentical|TestKernelResources|TestLoadKeepsTiledCopies|TestConv2DRowsBitIdentical|TestNormGLUEqualsSeq|TestPriorityQueue|TestSplitBF16Paths|TestPromptProducts|TestLogMelOnDevice|TestNormGridEqualsTilePerBlock'
  # The model packages' CUDA halves that run in seconds there (Mimi's and
  # the detokenizer's take minutes on the emulator: run them by hand).
  OMNIPIPE_CUDA_EMU=1 go test -timeout 30m "$@" ./stages/lfm2 ./stages/depth ./stages/conformer \
    -run 'TestStepsEqualPrefill|TestBatchEqualsSeparate|TestPromptRowsWithinTolerance|TestDecodeRowsBesidePrompt|TestFrameSampledEqualsHostPicks|TestBatchIndependence|TestEncodeBatchEqualsOneByOne'
  # --device auto takes the (emulated) GPU and a turn runs on it; turns
  # whose log-mel the (emulated) GPU computes equal the host's.
  OMNIPIPE_CUDA_EMU=1 go test -timeout 30m "$@" ./cmd/omni-pipe -run 'TestDeviceLogged'
  OMNIPIPE_CUDA_EMU=1 go test -timeout 30m "$@" ./pipeline -run 'TestDeviceLogMelTurns'
else
  echo "scripts/test.sh: no C++ compiler: the CUDA kernel contract did not run on the emulator" >&2
fi

# Real audio I/O against a private PulseAudio server (build tag "pulse"):
# run when pulseaudio is installed (.ci/run installs it).
if command -v pulseaudio >/dev/null 2>&1; then
  go test "$@" -tags pulse ./audio/device ./pipeline/live
else
  echo "scripts/test.sh: pulseaudio not installed: the -tags pulse device tests were not run" >&2
fi
