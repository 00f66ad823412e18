#!/usr/bin/env bash
# The README's main command: installs dependencies, builds the fusetune binary alone (release;
# not the tests or benchmarks), then fine-tunes a small Llama-architecture model (seeded
# random init, byte tokenizer) on a text the project ships, printing torchtune's step lines,
# and ends with a short sample from the model it trained and an HTML report of the run's
# curves. No downloads. Extra arguments are config overrides of the training run, e.g.
#   scripts/demo.sh compile=false epochs=2
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh release --target fusetune >&2
out=${FUSETUNE_DEMO_OUT:-out/demo}
# demo/tiny_full stops after 30 steps (the tests run it so), too few for a sample that reads as
# words: here it trains 30 whole epochs of the corpus (1650 steps; about 20 s on 2 idle cores),
# compiled, with a step line per epoch.
build/release/fusetune run full_finetune_single_device --config demo/tiny_full \
  output_dir="$out" compile=true epochs=30 max_steps_per_epoch=null log_every_n_steps=55 "$@"
# The newest checkpoint the run wrote (epoch_N, or step_N with save_every_n_steps).
last=$(ls -dt "$out"/epoch_* "$out"/step_* 2>/dev/null | head -n 1 || true)
echo
echo "A sample from $last:"
build/release/fusetune generate --config demo/tiny_generation checkpointer.checkpoint_dir="$last"
echo
build/release/fusetune report "$out" -o "$out/report.html"
echo "Checkpoints and logs: $out; the run's curves: $out/report.html (open it in a browser)"
