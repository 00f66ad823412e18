#!/usr/bin/env bash
# Builds the libFuzzer targets (CMake preset `asan`: clang, ASan+UBSan, the build the sanitizer
# unit tests use) and fuzzes each named target for a bounded time, starting from its committed
# seeds (tests/fuzz/seeds/<target>/) with its dictionary (tests/fuzz/dicts/<target>.dict).
#   scripts/fuzz.sh [seconds=60] [target ... | all]
# Targets: safetensors_fuzz hf_config_fuzz yaml_config_fuzz jsonl_rows_fuzz tokenizer_json_fuzz.
# Targets run side by side, one per core. Prints one line per target (seconds, executions,
# corpus size). Exits non-zero when a fuzzer finds a crash; the reproducer lands in
# build/asan/fuzz-artifacts/.
set -euo pipefail
cd "$(dirname "$0")/.."
all=(safetensors_fuzz hf_config_fuzz yaml_config_fuzz jsonl_rows_fuzz tokenizer_json_fuzz)
secs=${1:-60}
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ] || [ "${targets[0]}" = all ]; then targets=("${all[@]}"); fi
for t in "${targets[@]}"; do
  [ -d "tests/fuzz/seeds/$t" ] || { echo "unknown target $t (known: ${all[*]})" >&2; exit 2; }
done

cmake --preset asan >/dev/null
cmake --build --preset asan -j "$(nproc)" --target "${targets[@]}"

artifacts=build/asan/fuzz-artifacts/
mkdir -p "$artifacts"
# One target: fuzz for $secs, print its line, or print the log's tail and fail.
fuzz_one() {
  local t=$1
  # libFuzzer adds new inputs to the first corpus directory: a scratch one, the seeds stay as
  # committed.
  local corpus=build/asan/fuzz-run/$t/corpus log=build/asan/fuzz-run/$t/log.txt
  mkdir -p "$corpus"
  if ! "build/asan/tests/fuzz/$t" -max_total_time="$secs" -max_len=4096 -rss_limit_mb=2048 \
    -timeout=10 -print_final_stats=1 -dict="tests/fuzz/dicts/$t.dict" \
    -artifact_prefix="$artifacts" "$corpus" "tests/fuzz/seeds/$t" >"$log" 2>&1; then
    tail -40 "$log" >&2
    echo "fuzz: $t found a failure (reproducer in $artifacts)" >&2
    return 1
  fi
  local runs
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  echo "fuzz: $t ${secs}s, ${runs:-?} executions, corpus $(ls "$corpus" | wc -l) new inputs"
}

# The targets run side by side, one per core (each fuzzer is one process on one thread), each
# for the whole $secs.
echo "fuzzing ${targets[*]} for ${secs}s each, $(nproc) at a time" >&2
failed=0
running=0
for t in "${targets[@]}"; do
  if [ "$running" -ge "$(nproc)" ]; then
    wait -n || failed=1
    running=$((running - 1))
  fi
  fuzz_one "$t" &
  running=$((running + 1))
done
while [ "$running" -gt 0 ]; do
  wait -n || failed=1
  running=$((running - 1))
done
exit "$failed"
