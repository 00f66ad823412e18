#!/usr/bin/env bash
# Data parallelism against threads on one host, side by side in one run: one process x T
# threads against N ranks x T/N threads (mpirun), each ZeRO stage, the same global batch and
# data. Prints tokens/s (all ranks together), the ratio to the single process, rank 0's peak
# memory and its seconds per step in collectives (comm_s, waits for slower ranks included).
# Nothing here asserts a timing.
#   bench/dist_scaling.sh [--ranks 2] [--threads 2] [--stages 0,1,2,3] [--steps 8]
#                         [--recipe full|lora] [--compile true] [--batch 4] [--seq 256]
#                         [--overlap false|true|both]
# --overlap: overlap_grad_allreduce at ZeRO-0/1 (both: one row each way, side by side).
# The model is the benchmarks' "mid" shape (vocab 32000, dim 512, 8 layers, 8 heads, 4 kv
# heads, ffn 1408), random init, on the demo corpus. The first 2 steps are warm-up: tokens/s
# and comm_s are the means of the rest.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${FUSETUNE:-build/release/fusetune}
ranks=2 threads=2 stages=0,1,2,3 steps=8 recipe=full compile=true batch=4 seq=256 overlap=false
while [ $# -gt 0 ]; do
  case "$1" in
    --ranks) ranks=$2 ;; --threads) threads=$2 ;; --stages) stages=$2 ;; --steps) steps=$2 ;;
    --recipe) recipe=$2 ;; --compile) compile=$2 ;; --batch) batch=$2 ;; --seq) seq=$2 ;;
    --overlap) overlap=$2 ;;
    *) echo "unknown option $1 (see the header of $0)" >&2; exit 2 ;;
  esac
  shift 2
done
[ -x "$B" ] || { echo "$B not built (scripts/build.sh)" >&2; exit 1; }
(( batch % ranks == 0 )) || { echo "--batch $batch is not a multiple of --ranks $ranks" >&2; exit 2; }
(( threads % ranks == 0 )) || { echo "--threads $threads is not a multiple of --ranks $ranks" >&2; exit 2; }
case "$overlap" in
  false|true) overlaps=("$overlap") ;; both) overlaps=(false true) ;;
  *) echo "--overlap is false, true or both" >&2; exit 2 ;;
esac
case "$recipe" in
  full) config=demo/tiny_full single=full_finetune_single_device dist=full_finetune_distributed ;;
  lora) config=demo/tiny_full single=lora_finetune_single_device dist=lora_finetune_distributed ;;
  *) echo "--recipe is full or lora" >&2; exit 2 ;;
esac
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
common=(model.init=random model.vocab_size=32000 model.hidden_size=512 model.intermediate_size=1408
  model.num_hidden_layers=8 model.num_attention_heads=8 model.num_key_value_heads=4
  model.max_position_embeddings=$seq tokenizer.max_seq_len=$seq dataset.packed=true
  max_steps_per_epoch=$steps log_every_n_steps=1 log_peak_memory_stats=true compile=$compile
  gradient_accumulation_steps=1)
[ "$recipe" = lora ] && common+=('model.lora_attn_modules=[q_proj,v_proj]' model.lora_rank=8 model.lora_alpha=16)

# Mean of a metric over steps 3.. of a metrics.jsonl, and the max of peak_memory_alloc_bytes.
summarize() {
  awk -v key="$2" '
    { if (match($0, "\"step\":[0-9]+")) step = substr($0, RSTART + 7, RLENGTH - 7) + 0
      v = ""; if (match($0, "\"" key "\":[-0-9.eE+]+")) v = substr($0, RSTART + length(key) + 3, RLENGTH - length(key) - 3)
      if (match($0, "\"peak_memory_alloc_bytes\":[0-9]+")) { p = substr($0, RSTART + 26, RLENGTH - 26) + 0; if (p > peak) peak = p }
      if (step > 2 && v != "") { s += v; n++ } }
    END { printf "%s %d\n", (n ? s / n : 0), peak }' "$1"
}

printf '%-34s %12s %8s %14s %10s\n' "run" "tokens/s" "ratio" "rank-0 peak" "comm_s"
run_one() {  # label, out dir, launcher...
  local label=$1 out=$2; shift 2
  if ! "$@" output_dir="$out" >"$out.log" 2>&1; then
    echo "$label failed; its output:" >&2; tail -20 "$out.log" >&2; exit 1
  fi
  local tps peak comm
  read -r tps peak <<<"$(summarize "$out/logs/metrics.jsonl" tokens_per_second_per_gpu)"
  read -r comm _ <<<"$(summarize "$out/logs/metrics.jsonl" comm_s)"
  echo "$tps $peak $comm"
}
read -r base_tps base_peak _ <<<"$(OMP_NUM_THREADS=$threads run_one "1 x $threads threads" "$work/single" \
  "$B" run "$single" --config "$config" "${common[@]}" batch_size="$batch" num_threads="$threads")"
printf '%-34s %12.1f %8.3f %10.1f MiB %10s\n' "1 process x $threads thr" "$base_tps" 1 \
  "$(awk -v p="$base_peak" 'BEGIN { print p / 1048576 }')" "-"
per_rank=$((threads / ranks))
IFS=, read -ra stage_list <<<"$stages"
for s in "${stage_list[@]}"; do
  for o in "${overlaps[@]}"; do
    (( s < 2 )) || [ "$o" = false ] || continue  # overlapping applies to ZeRO-0/1 only
    label="$ranks ranks x $per_rank thr, ZeRO-$s"
    extra=()
    (( s >= 2 )) || extra=(overlap_grad_allreduce="$o")
    [ "$overlap" = false ] || [ "$s" -ge 2 ] || label+=" ovl=$o"
    read -r tps peak comm <<<"$(run_one "$label" "$work/z$s$o" \
      env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=$per_rank \
      mpirun -np "$ranks" --bind-to none "$B" run "$dist" --config "$config" "${common[@]}" \
      batch_size=$((batch / ranks)) num_threads=$per_rank zero_stage="$s" "${extra[@]}")"
    # tokens_per_second_per_gpu is rank 0's own tokens: the ranks' batches are equal, so the
    # total is N times it.
    total=$(awk -v t="$tps" -v n="$ranks" 'BEGIN { print t * n }')
    printf '%-34s %12.1f %8.3f %10.1f MiB %10.3f\n' "$label" "$total" \
      "$(awk -v a="$total" -v b="$base_tps" 'BEGIN { print a / b }')" \
      "$(awk -v p="$peak" 'BEGIN { print p / 1048576 }')" "$comm"
  done
done
