#!/usr/bin/env bash
# Installs a real llama.cpp for the GGUF export conformance test (tools/llama-cpp-ref:
# node-llama-cpp 3.21.1, whose npm package ships prebuilt llama.cpp binaries for linux-x64),
# exactly as pinned in its package-lock.json. Install scripts are skipped: the prebuilt CPU
# build needs none (the package's postinstall would only try to download or compile another
# build when no prebuilt one fits). Skips quietly if it is already there.
set -euo pipefail
cd "$(dirname "$0")/../tools/llama-cpp-ref" 2>/dev/null || exit 0
[ -d node_modules/node-llama-cpp ] && exit 0
command -v npm >/dev/null || { echo "npm not found" >&2; exit 1; }
npm ci --ignore-scripts --no-audit --no-fund --silent >/dev/null
