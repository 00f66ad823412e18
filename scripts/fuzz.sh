#!/usr/bin/env bash
# Builds the libFuzzer targets (CMake preset `fuzz`, clang + ASan) and fuzzes one of them for a
# bounded time on a seed corpus generated here (valid tiny safetensors files / config.json).
#   scripts/fuzz.sh [seconds=60] [target=safetensors_fuzz|hf_config_fuzz]
# Exits non-zero when the fuzzer finds a crash; the reproducer lands in build/fuzz/artifacts/.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
target=${2:-safetensors_fuzz}

cmake --preset fuzz >/dev/null
cmake --build --preset fuzz -j "$(nproc)" --target "$target"

work=build/fuzz/run/$target
seeds=$work/seeds
corpus=$work/corpus
artifacts=build/fuzz/artifacts/
mkdir -p "$seeds" "$corpus" "$artifacts"

# n as 8 little-endian bytes
le64() {
  local n=$1 i
  for i in 0 1 2 3 4 5 6 7; do printf "\\x$(printf %02x $(((n >> (8 * i)) & 255)))"; done
}
# safetensors file: header padded with spaces to a multiple of 8 (like HF), then data bytes
# given as printf escapes.
seed_st() {
  local out=$1 header=$2 data=$3
  while [ $(((${#header}) % 8)) -ne 0 ]; do header="$header "; done
  { le64 ${#header}; printf '%s' "$header"; printf "$data"; } >"$seeds/$out"
}

case "$target" in
  safetensors_fuzz)
    seed_st f32.st '{"__metadata__":{"format":"pt"},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}' \
      '\x00\x00\x80\x3f\x00\x00\x00\xc0'
    seed_st mixed.st '{"a":{"dtype":"BF16","shape":[2,1],"data_offsets":[0,4]},"b":{"dtype":"F16","shape":[1],"data_offsets":[4,6]},"c":{"dtype":"I64","shape":[],"data_offsets":[6,14]},"d":{"dtype":"F64","shape":[0,3],"data_offsets":[14,14]},"e":{"dtype":"I32","shape":[1],"data_offsets":[14,18]}}' \
      '\x80\x3f\x00\xc0\x00\x3c\x01\x00\x00\x00\x00\x00\x00\x00\x07\x00\x00\x00'
    seed_st empty.st '{}' ''
    cat >"$work/dict" <<'EOF'
"dtype"
"shape"
"data_offsets"
"__metadata__"
"F32"
"F64"
"BF16"
"F16"
"I32"
"I64"
"U8"
"format"
"pt"
EOF
    ;;
  hf_config_fuzz)
    printf '%s' '{"model_type":"llama","hidden_size":64,"intermediate_size":172,"num_hidden_layers":5,"num_attention_heads":8,"num_key_value_heads":4,"vocab_size":512,"tie_word_embeddings":true,"eos_token_id":[2,3],"rope_scaling":{"rope_type":"llama3","factor":8.0,"low_freq_factor":1.0,"high_freq_factor":4.0,"original_max_position_embeddings":8192}}' >"$seeds/llama.json"
    printf '%s' '{"model_type":"qwen2","hidden_size":32,"intermediate_size":64,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"vocab_size":100,"use_sliding_window":true,"sliding_window":16,"head_dim":8,"rope_scaling":{"type":"linear","factor":2}}' >"$seeds/qwen2.json"
    cat >"$work/dict" <<'EOF'
"model_type"
"llama"
"mistral"
"qwen2"
"hidden_size"
"intermediate_size"
"num_hidden_layers"
"num_attention_heads"
"num_key_value_heads"
"head_dim"
"vocab_size"
"rope_scaling"
"rope_type"
"llama3"
"linear"
"eos_token_id"
"tie_word_embeddings"
"sliding_window"
EOF
    ;;
  *) echo "unknown target $target" >&2; exit 2 ;;
esac

echo "fuzzing $target for ${secs}s (corpus $corpus, seeds $seeds)" >&2
"build/fuzz/tests/fuzz/$target" -max_total_time="$secs" -max_len=4096 -rss_limit_mb=2048 \
  -timeout=10 -print_final_stats=1 -dict="$work/dict" -artifact_prefix="$artifacts" \
  "$corpus" "$seeds"
