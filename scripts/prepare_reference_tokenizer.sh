#!/usr/bin/env bash
# Installs the independent tokenizer.json implementations used as references by the tokenizer
# conformance tests and benchmark (tools/tokenizer-ref: the official Hugging Face tokenizers
# library's Node bindings, and @lenml/tokenizers), exactly as pinned in its package-lock.json.
# Skips quietly if they are already there.
set -euo pipefail
cd "$(dirname "$0")/../tools/tokenizer-ref" 2>/dev/null || exit 0
[ -d node_modules/@lenml/tokenizers ] && [ -d node_modules/tokenizers ] && exit 0
command -v npm >/dev/null || { echo "npm not found" >&2; exit 1; }
npm ci --no-audit --no-fund --silent >/dev/null
