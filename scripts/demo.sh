#!/usr/bin/env bash
# The README's main command: installs dependencies, builds (release), then fine-tunes a small
# Llama-architecture model (seeded random init, byte tokenizer) on a text the project ships,
# printing torchtune's step lines. No downloads. Extra arguments are config overrides, e.g.
#   scripts/demo.sh compile=true epochs=2
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh release >&2
out=${FUSETUNE_DEMO_OUT:-out/demo}
exec build/release/fusetune run full_finetune_single_device --config demo/tiny_full \
  output_dir="$out" "$@"
