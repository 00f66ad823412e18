// fusetune init-checkpoint --config CONFIG --output DIR: a randomly initialized model written
// as a Hugging Face checkpoint, one tensor at a time (a model of any size never sits in memory
// whole), with the values `model.init: random` gives the same seed.
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>

#include "fusetune/cli/args.h"
#include "fusetune/cli/command.h"
#include "fusetune/core/memory.h"
#include "fusetune/io/hf_checkpoint.h"
#include "fusetune/io/hf_config.h"
#include "fusetune/models/model_family.h"
#include "fusetune/models/parameters.h"
#include "fusetune/util/error.h"
#include "fusetune/util/strings.h"

namespace fusetune::cli {

const char* const kInitCheckpointHelp =
    "usage: fusetune init-checkpoint --config CONFIG --output DIR [--dtype fp32|bf16]\n"
    "                                [--max-shard-size SIZE] [--seed N] [--std X] [--dry-run]\n"
    "\n"
    "Writes a randomly initialized model of the architecture in CONFIG (a Hugging Face\n"
    "config.json, or a directory holding one) to DIR as config.json + safetensors shards\n"
    "(model.safetensors when it fits one shard), replacing a checkpoint there. The values are\n"
    "those of `model.init: random` with the same seed and model.initializer_range: normal(0,\n"
    "std) matrices, ones for norm weights, zeros for biases. Tensors are generated and written\n"
    "one at a time, so memory stays at one tensor whatever the model size.\n"
    "\n"
    "  --dtype           fp32 (default) or bf16\n"
    "  --max-shard-size  the largest shard, e.g. 5GB (the default), 500MB, 2GiB, or bytes\n"
    "  --seed            default 0\n"
    "  --std             the normal's standard deviation, default 0.02\n"
    "  --dry-run         generate every tensor, write nothing, report the time\n";

namespace {

// "5GB" (10^9), "2GiB" (2^30), "500MB", "1.5GB", "4096": bytes.
int64_t parse_size(const std::string& text) {
  size_t end = 0;
  double v = 0;
  try {
    v = std::stod(text, &end);
  } catch (const std::exception&) {
    end = 0;
  }
  std::string unit = text.substr(end);
  for (char& c : unit) c = char(std::toupper(uint8_t(c)));
  static const std::pair<const char*, double> units[] = {{"", 1},
                                                         {"B", 1},
                                                         {"KB", 1e3},
                                                         {"MB", 1e6},
                                                         {"GB", 1e9},
                                                         {"TB", 1e12},
                                                         {"KIB", 1024.0},
                                                         {"MIB", 1048576.0},
                                                         {"GIB", 1073741824.0},
                                                         {"TIB", 1099511627776.0}};
  for (const auto& [name, scale] : units)
    if (end > 0 && unit == name && std::isfinite(v) && v * scale >= 1 && v * scale < 9.2e18)
      return int64_t(v * scale);
  throw Error("--max-shard-size: '" + text +
              "' is not a size (a positive number with an optional unit: B, KB, MB, GB, "
              "KiB, MiB, GiB)");
}

}  // namespace

int cmd_init_checkpoint(const std::vector<std::string>& argv) {
  Args a = parse_args(
      argv, {{"config", "output", "dtype", "max-shard-size", "seed", "std"}, {"dry-run"}, false});
  FT_CHECK(a.positional.empty(), "fusetune init-checkpoint takes no positional arguments (got '" +
                                     (a.positional.empty() ? "" : a.positional[0]) +
                                     "'); see --help");
  const std::string config = a.option("config"), output = a.option("output");
  const bool dry_run = a.flag("dry-run");
  FT_CHECK(!config.empty() && (dry_run || !output.empty()),
           "usage: fusetune init-checkpoint --config CONFIG --output DIR (see --help)");
  const std::string dtype = a.option("dtype").empty() ? "fp32" : a.option("dtype");
  FT_CHECK(dtype == "fp32" || dtype == "bf16", "--dtype must be fp32 or bf16, got '" + dtype + "'");
  uint64_t seed = 0;
  if (!a.option("seed").empty()) {
    size_t end = 0;
    long long s = -1;
    try {
      s = std::stoll(a.option("seed"), &end);
    } catch (const std::exception&) {
    }
    FT_CHECK(s >= 0 && end == a.option("seed").size(),
             "--seed must be a non-negative integer, got '" + a.option("seed") + "'");
    seed = uint64_t(s);
  }
  double std_dev = 0.02;
  if (!a.option("std").empty()) {
    size_t end = 0;
    try {
      std_dev = std::stod(a.option("std"), &end);
    } catch (const std::exception&) {
      end = 0;
    }
    FT_CHECK(end == a.option("std").size() && std::isfinite(std_dev) && std_dev >= 0,
             "--std must be a non-negative number, got '" + a.option("std") + "'");
  }

  const ModelConfig cfg = load_model_config(config);
  SaveOptions so;
  so.dtype = dtype == "bf16" ? DType::BF16 : DType::F32;
  if (!a.option("max-shard-size").empty())
    so.max_shard_bytes = parse_size(a.option("max-shard-size"));

  std::vector<TensorSource> sources;
  int64_t numel = 0;
  for (const auto& [name, shape] : expected_parameters(cfg)) {
    numel += shape_numel(shape);
    // Gemma's (1 + w) norms start at w = 0, an effective scale of 1 (as transformers').
    const bool zero_norms = model_family(cfg.model_type).norm_adds_one;
    sources.push_back(
        {name, shape, so.dtype, [name = name, shape = shape, seed, std_dev, &so, zero_norms] {
           Tensor t = Tensor::empty(shape, so.dtype);
           init_parameter(name, seed, std_dev, t, zero_norms);
           return t;
         }});
  }
  const auto t0 = std::chrono::steady_clock::now();
  if (dry_run) {
    for (const auto& s : sources) s.produce();
  } else {
    save_hf_checkpoint(output, cfg, sources, so);
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const int64_t bytes = numel * int64_t(dtype_size(so.dtype));
  std::printf("%s %lld parameters (%s, %s) in %.1f s; peak tensor memory %s\n",
              dry_run ? "generated (dry run, nothing written)" : ("wrote " + output + ":").c_str(),
              static_cast<long long>(numel), dtype.c_str(), format_bytes(bytes).c_str(), secs,
              format_bytes(memory::peak_bytes()).c_str());
  return 0;
}

}  // namespace fusetune::cli
