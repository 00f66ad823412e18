#!/usr/bin/env bash
# Installs the independent JavaScript tokenizer.json implementation used as a reference by
# the tokenizer conformance tests (tools/tokenizer-ref). Skips quietly if it is already there.
set -euo pipefail
cd "$(dirname "$0")/../tools/tokenizer-ref" 2>/dev/null || exit 0
[ -d node_modules/@lenml/tokenizers ] && exit 0
command -v npm >/dev/null || { echo "npm not found" >&2; exit 1; }
npm install --no-audit --no-fund --silent >/dev/null
