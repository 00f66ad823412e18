#pragma once
// Every training recipe as a tiny run: the variants (fp32/bf16, LoRA/DoRA/QLoRA, QAT, DPO, ZeRO
// stages, one process or 2 MPI ranks) that the resume matrix trains and the golden runs
// (tests/golden/) record. A case is a recipe, its data and model, and the keys that make it
// the variant; write_case_config() makes its config in a scratch directory.
#include <cstdint>
#include <filesystem>
#include <map>
#include <ostream>
#include <vector>

#include <nlohmann/json.hpp>

#include "resume_runs.h"

namespace fusetune::testing {

// How a case's model starts: random weights, random weights with LoRA adapters, or a
// checkpoint written first (full DPO's policy and reference).
enum class TinyModel { Full, Lora, FromCheckpoint };

struct RecipeCase {
  const char* name;
  const char* recipe;
  int ranks;  // 1: one process; 2: mpirun -np 2
  TinyData data;
  TinyModel model;
  Overrides extra;  // dtype, zero_stage, the variant's keys
};

// gtest prints a failing case's parameter: its name.
inline void PrintTo(const RecipeCase& c, std::ostream* os) { *os << c.name; }

// The LoRA keys of the Lora rows (dropout on, so its seed must continue on resume) and the QAT
// keys (fake quantization from step 2).
extern const Overrides kTinyLoraKeys;
extern const Overrides kTinyQatKeys;

// Every recipe x {fp32, bf16} with its variants; the distributed ones at 2 ranks (bf16 rows at
// ZeRO 0/1: 2-3 refuse bf16).
const std::vector<RecipeCase>& recipe_matrix();

// Writes `c`'s config (and its data or starting checkpoint) under `dir`; returns the config's
// path and sets `o` to the case's keys (the LoRA keys, then `extra`) on top of `o`.
std::filesystem::path write_case_config(const RecipeCase& c, const std::filesystem::path& dir,
                                        Overrides& o);

// Each logged training step's values that a rerun must repeat exactly (loss, lr, grad_norm,
// and the DPO rewards when logged), by step.
std::map<int64_t, nlohmann::json> compared_step_values(const std::filesystem::path& output_dir);

}  // namespace fusetune::testing
