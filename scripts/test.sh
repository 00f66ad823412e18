#!/usr/bin/env bash
# The README's test command: installs dependencies, builds (release), runs every test with CTest.
# Conformance tests use ../shared/assets (override with FUSETUNE_ASSETS) and skip without it.
# Then the unit tests again under ASan+UBSan (preset asan). FUSETUNE_TEST_PRESETS=release skips that.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh --with-reference
scripts/prepare_reference_tokenizer.sh || echo "note: reference tokenizer unavailable; its conformance tests will skip" >&2
scripts/prepare_llama_cpp.sh || echo "note: node-llama-cpp unavailable; the GGUF/llama.cpp conformance test will skip" >&2
for preset in ${FUSETUNE_TEST_PRESETS:-release asan}; do
  if [ "$preset" = release ]; then
    scripts/build.sh "$preset"
    ctest --preset "$preset" -j "$(nproc)"
  else
    # Sanitizer builds run the unit tests only (line tables at -O1: see CMakePresets.json).
    scripts/build.sh "$preset" --target fusetune_unit_tests
    ctest --preset "$preset" -j "$(nproc)" -L unit
  fi
done
