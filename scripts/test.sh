#!/usr/bin/env bash
# The README's test command: installs dependencies, builds (release), runs every test with CTest.
# Conformance tests use ../shared/assets (override with FUSETUNE_ASSETS) and skip without it.
# Then the unit tests again under ASan+UBSan (preset asan, clang; the same build carries the
# libFuzzer targets that scripts/fuzz.sh runs). FUSETUNE_TEST_PRESETS=release skips that.
# Each phase prints its wall time.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/phases.sh
phase deps scripts/install_deps.sh --with-reference
# The reference tools are npm installs, bound by the network rather than the cores: they run
# beside the first build, and the first test phase waits for them.
phase references bash -c '
  scripts/prepare_reference_tokenizer.sh ||
    echo "note: reference tokenizer unavailable; its conformance tests will skip" >&2
  scripts/prepare_llama_cpp.sh ||
    echo "note: node-llama-cpp unavailable; the GGUF/llama.cpp conformance test will skip" >&2' &
references=$!
wait_for_references() { [ -z "$references" ] || wait "$references"; references=; }
for preset in ${FUSETUNE_TEST_PRESETS:-release asan}; do
  if [ "$preset" = release ]; then
    phase "build-$preset" scripts/build.sh "$preset"
    wait_for_references
    phase "test-$preset" ctest --preset "$preset" -j "$(nproc)"
  else
    # Sanitizer builds run the unit tests only (line tables at -O1: see CMakePresets.json).
    phase "build-$preset" scripts/build.sh "$preset" --target fusetune_unit_tests
    wait_for_references
    phase "test-$preset" ctest --preset "$preset" -j "$(nproc)" -L unit
  fi
done
