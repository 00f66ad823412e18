#include "fusetune/io/hf_checkpoint.h"

#include <cctype>
#include <cstdio>
#include <memory>
#include <optional>
#include <set>

#include <nlohmann/json.hpp>

#include "fusetune/io/hf_config.h"
#include "fusetune/models/model_family.h"
#include "fusetune/util/error.h"
#include "fusetune/util/fs.h"
#include "fusetune/util/strings.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace fusetune {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// A shard name from an index must be a plain file name inside the checkpoint directory.
void check_plain_name(const std::string& name, const std::string& where) {
  FT_CHECK(
      !name.empty() && name.find('/') == std::string::npos && name != "." && name != "..",
      where + ": '" + printable(name) + "' is not a plain file name in the checkpoint directory");
}

// Why a tensor name is not expected, when we can tell.
std::string unexpected_hint(const std::string& name, const ModelConfig& c,
                            const std::vector<std::string>& expected) {
  // "model.layers.<i>." with i past the configured layer count.
  const std::string prefix = "model.layers.";
  size_t digits = 0;
  while (name.size() > prefix.size() + digits &&
         std::isdigit(uint8_t(name[prefix.size() + digits])))
    ++digits;
  if (starts_with(name, prefix) && digits > 0 && digits < 10 &&
      name.size() > prefix.size() + digits && name[prefix.size() + digits] == '.' &&
      std::stoll(name.substr(prefix.size(), digits)) >= c.num_hidden_layers)
    return " (config.json has num_hidden_layers = " + std::to_string(c.num_hidden_layers) + ")";
  if (ends_with(name, ".bias") && !c.attention_bias)
    return " (config.json implies no attention biases)";
  const std::string close = closest_match(name, expected);
  return close.empty() ? "" : " (did you mean '" + close + "'?)";
}

json read_json(const fs::path& p) {
  const std::string text = read_file(p);
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    throw Error(p.string() + ": not valid JSON (" + e.what() + ")");
  }
}

void write_text(const fs::path& p, const std::string& text) {
  FileWriter w(p);
  w.write(text);
  w.close();
}

const char* torch_dtype_name(DType t) {
  switch (t) {
    case DType::BF16:
      return "bfloat16";
    case DType::F16:
      return "float16";
    case DType::F64:
      return "float64";
    default:
      return "float32";
  }
}

}  // namespace

std::vector<std::pair<std::string, Shape>> expected_parameters(const ModelConfig& c) {
  const int64_t D = c.hidden_size, V = c.vocab_size, F = c.intermediate_size;
  const int64_t q = c.num_attention_heads * c.head_dim, kv = c.num_key_value_heads * c.head_dim;
  std::vector<std::pair<std::string, Shape>> out;
  out.push_back({"model.embed_tokens.weight", {V, D}});
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    out.push_back({p + "input_layernorm.weight", {D}});
    const bool fused = model_family(c.model_type).fused_projections;
    if (fused) out.push_back({p + "self_attn.qkv_proj.weight", {q + 2 * kv, D}});  // Phi-3
    if (!fused) out.push_back({p + "self_attn.q_proj.weight", {q, D}});
    if (c.attention_bias) out.push_back({p + "self_attn.q_proj.bias", {q}});
    if (!fused) out.push_back({p + "self_attn.k_proj.weight", {kv, D}});
    if (c.attention_bias) out.push_back({p + "self_attn.k_proj.bias", {kv}});
    if (!fused) out.push_back({p + "self_attn.v_proj.weight", {kv, D}});
    if (c.attention_bias) out.push_back({p + "self_attn.v_proj.bias", {kv}});
    if (model_family(c.model_type).qk_norm) {
      out.push_back({p + "self_attn.q_norm.weight", {c.head_dim}});
      out.push_back({p + "self_attn.k_norm.weight", {c.head_dim}});
    }
    out.push_back({p + "self_attn.o_proj.weight", {D, q}});
    out.push_back({p + "post_attention_layernorm.weight", {D}});
    if (model_family(c.model_type).post_norms) {
      out.push_back({p + "pre_feedforward_layernorm.weight", {D}});
      out.push_back({p + "post_feedforward_layernorm.weight", {D}});
    }
    if (fused) out.push_back({p + "mlp.gate_up_proj.weight", {2 * F, D}});
    if (!fused) out.push_back({p + "mlp.gate_proj.weight", {F, D}});
    if (!fused) out.push_back({p + "mlp.up_proj.weight", {F, D}});
    out.push_back({p + "mlp.down_proj.weight", {D, F}});
  }
  out.push_back({"model.norm.weight", {D}});
  // A sequence classifier's head is `score` (no bias) instead of lm_head (docs/design.md §12).
  if (c.num_labels > 0)
    out.push_back({"score.weight", {c.num_labels, D}});
  else if (!c.tie_word_embeddings)
    out.push_back({"lm_head.weight", {V, D}});
  return out;
}

const std::vector<std::string>& hf_side_files() {
  static const std::vector<std::string> files = {
      "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
      "generation_config.json",
      // a multimodal checkpoint's processor files
      "preprocessor_config.json", "processor_config.json", "chat_template.json"};
  return files;
}

namespace {

// A checkpoint directory's safetensors files, opened, and which holds which tensor.
struct TensorFiles {
  std::vector<SafetensorsFile> opened;
  std::map<std::string, size_t> where;  // tensor -> index into `opened`
};

// `files` (relative to dir) when given, else model.safetensors.index.json's shards (checked
// against it), else model.safetensors.
TensorFiles open_tensor_files(const fs::path& dir, const std::vector<std::string>& files) {
  TensorFiles tf;
  std::error_code ec;
  std::vector<SafetensorsFile>& opened = tf.opened;
  std::map<std::string, size_t>& where = tf.where;
  auto add_file = [&](const fs::path& p) {
    opened.push_back(SafetensorsFile::open(p));
    for (const auto& name : opened.back().names()) {
      auto [it, fresh] = where.emplace(name, opened.size() - 1);
      FT_CHECK(fresh, "tensor '" + printable(name) + "' is in both " + opened[it->second].path() +
                          " and " + p.string());
    }
  };
  const fs::path index_path = dir / "model.safetensors.index.json";
  if (!files.empty()) {
    for (const auto& f : files) {
      fs::path p = fs::path(f).is_absolute() ? fs::path(f) : dir / f;
      FT_CHECK(fs::is_regular_file(p, ec), "checkpoint file '" + p.string() + "' does not exist");
      add_file(p);
    }
  } else if (fs::exists(index_path, ec)) {
    const std::string idx = index_path.string();
    json index = read_json(index_path);
    FT_CHECK(index.is_object() && index.contains("weight_map") && index["weight_map"].is_object(),
             idx + ": expected an object with a 'weight_map' object");
    std::map<std::string, std::string> claims;  // tensor -> file name
    std::set<std::string> shard_names;
    for (const auto& [tensor, file] : index["weight_map"].items()) {
      FT_CHECK(file.is_string(), idx + ": weight_map entry for '" + printable(tensor) +
                                     "' is a JSON " + file.type_name() + ", expected a file name");
      const std::string name = file.get<std::string>();
      check_plain_name(name, idx);
      claims[tensor] = name;
      shard_names.insert(name);
    }
    for (const auto& name : shard_names)
      FT_CHECK(fs::is_regular_file(dir / name, ec), idx + ": weight_map names shard '" +
                                                        printable(name) + "', but " +
                                                        (dir / name).string() + " does not exist");
    for (const auto& name : shard_names) add_file(dir / name);
    for (const auto& [tensor, file] : claims) {
      auto it = where.find(tensor);
      FT_CHECK(it != where.end() && opened[it->second].path() == (dir / file).string(),
               idx + ": weight_map says tensor '" + printable(tensor) + "' is in '" +
                   printable(file) + "', but that file has no such tensor");
    }
    for (const auto& [tensor, i] : where)
      FT_CHECK(claims.count(tensor), idx + ": tensor '" + printable(tensor) + "' in " +
                                         opened[i].path() + " is not listed in weight_map");
  } else if (fs::exists(dir / "model.safetensors", ec)) {
    add_file(dir / "model.safetensors");
  } else {
    std::string hint;
    if (fs::exists(dir / "pytorch_model.bin", ec) ||
        fs::exists(dir / "pytorch_model.bin.index.json", ec))
      hint =
          " (pytorch_model.bin found: fusetune never loads pickle files; convert the "
          "checkpoint to safetensors)";
    throw Error("checkpoint directory '" + dir.string() +
                "' has neither model.safetensors nor model.safetensors.index.json" + hint);
  }
  return tf;
}

// Where a multimodal checkpoint (Gemma3ForConditionalGeneration) keeps its text model: under
// language_model.model. and language_model.lm_head (transformers before 4.52, as the published
// Gemma 3 checkpoints are), or under model.language_model. with lm_head at the top (later ones).
struct MultimodalNames {
  std::string model_prefix = "language_model.model.", lm_head = "language_model.lm_head.weight";

  // The text model's name of stored tensor `s` ("model.layers.0...."); "" for another part's.
  std::string text_name(const std::string& s) const {
    if (starts_with(s, model_prefix)) return "model." + s.substr(model_prefix.size());
    return s == lm_head ? "lm_head.weight" : "";
  }
  std::string stored_name(const std::string& text) const {
    return text == "lm_head.weight" ? lm_head : model_prefix + text.substr(6);  // "model."
  }
};

MultimodalNames multimodal_names(const std::map<std::string, size_t>& where) {
  MultimodalNames n;
  for (const auto& [name, i] : where)
    if (starts_with(name, "model.language_model.")) {
      n.model_prefix = "model.language_model.";
      n.lm_head = "lm_head.weight";
    }
  return n;
}

// A checkpoint directory opened and checked, before any tensor is read.
struct OpenedCheckpoint {
  ModelConfig config;
  std::vector<SafetensorsFile> opened;
  std::map<std::string, size_t> where;  // tensor (the text model's name) -> index into `opened`
  std::map<std::string, std::string> stored;  // text model's name -> the file's, where they differ
  std::vector<std::pair<std::string, Shape>> expected;
  std::optional<MultimodalNames> multimodal;  // set for a multimodal checkpoint

  const std::string& file_name(const std::string& name) const {
    auto it = stored.find(name);
    return it == stored.end() ? name : it->second;
  }
};

// A multimodal checkpoint: its text model's tensors go by the text model's names; the others
// (vision tower, projector) are not loaded, and a save carries them through from `dir`.
void keep_text_model(OpenedCheckpoint& ck, const fs::path& dir,
                     const std::vector<std::string>& files) {
  const MultimodalNames names = multimodal_names(ck.where);
  ck.multimodal = names;
  std::map<std::string, size_t> text;
  size_t others = 0;
  for (const auto& [name, i] : ck.where) {
    const std::string t = names.text_name(name);
    if (t.empty()) {
      ++others;
      continue;
    }
    text[t] = i;
    ck.stored[t] = name;
  }
  ck.where = std::move(text);
  ck.config.multimodal_source_dir = dir.string();
  ck.config.multimodal_source_files = files;
  ck.config.multimodal_text_prefix = names.model_prefix;
  std::fprintf(stderr,
               "note: %s: a %s checkpoint: its text model (%s*) is loaded; its %zu other tensors "
               "(vision tower, projector) are not, and a save writes them back unchanged\n",
               dir.string().c_str(), ck.config.multimodal.value("model_type", "").c_str(),
               names.model_prefix.c_str(), others);
}

OpenedCheckpoint open_checkpoint(const fs::path& dir, const std::vector<std::string>& files,
                                 DType target) {
  FT_CHECK(is_floating(target), std::string("cannot load a checkpoint as ") + dtype_name(target) +
                                    " (not a float type)");
  std::error_code ec;
  FT_CHECK(fs::is_directory(dir, ec),
           "checkpoint directory '" + dir.string() + "' does not exist or is not a directory");
  OpenedCheckpoint ck;
  ck.config = load_model_config(dir);
  TensorFiles tf = open_tensor_files(dir, files);
  ck.opened = std::move(tf.opened);
  ck.where = std::move(tf.where);
  if (ck.config.multimodal.is_object()) keep_text_model(ck, dir, files);
  const std::vector<SafetensorsFile>& opened = ck.opened;
  const std::map<std::string, size_t>& where = ck.where;

  // Check every tensor against what config.json implies.
  ck.expected = expected_parameters(ck.config);
  const auto& expected = ck.expected;
  std::map<std::string, Shape> want(expected.begin(), expected.end());
  std::vector<std::string> expected_names;
  for (const auto& e : expected) expected_names.push_back(e.first);
  for (const auto& [name, i] : where) {
    const SafetensorsFile& f = opened[i];
    if (ends_with(name, ".rotary_emb.inv_freq")) continue;  // a buffer old exports include
    if (name == "lm_head.weight" && ck.config.tie_word_embeddings) continue;  // tied: unused
    auto w = want.find(name);
    FT_CHECK(w != want.end(), "unexpected tensor '" + printable(name) + "' in " + f.path() +
                                  ": not a " + ck.config.model_type +
                                  " parameter for this config.json" +
                                  unexpected_hint(name, ck.config, expected_names));
    const TensorInfo& info = f.info(ck.file_name(name));
    FT_CHECK(info.shape == w->second, "tensor '" + ck.file_name(name) + "' in " + f.path() +
                                          " has shape " + shape_str(info.shape) +
                                          " but config.json implies " + shape_str(w->second));
    FT_CHECK(is_floating(info.dtype), "tensor '" + ck.file_name(name) + "' in " + f.path() +
                                          " has dtype " + dtype_name(info.dtype) +
                                          ", expected a float type");
  }
  std::vector<std::string> missing;
  for (const auto& [name, shape] : expected)
    if (!where.count(name)) missing.push_back(name);
  if (!missing.empty()) {
    const std::string more =
        missing.size() > 1 ? " and " + std::to_string(missing.size() - 1) + " more" : "";
    const std::string first =
        ck.multimodal ? ck.multimodal->stored_name(missing.front()) : missing.front();
    throw Error("checkpoint '" + dir.string() + "' is missing tensor '" + first +
                "' (config.json implies shape " + shape_str(want[missing.front()]) + ")" + more);
  }

  return ck;
}

}  // namespace

HFCheckpoint load_hf_checkpoint(const fs::path& dir, const std::vector<std::string>& files,
                                DType target) {
  OpenedCheckpoint oc = open_checkpoint(dir, files, target);
  HFCheckpoint ck;
  ck.config = oc.config;
  for (const auto& [name, shape] : oc.expected) {
    const SafetensorsFile& f = oc.opened[oc.where.at(name)];
    Tensor t = f.tensor(oc.file_name(name));
    ck.tensors[name] = t.dtype() == target ? t : t.to(target);
    ck.source_file[name] = f.path();
  }
  return ck;
}

HFCheckpoint load_hf_checkpoint_owned(const fs::path& dir, const std::vector<std::string>& files,
                                      DType target, ParamSink* sink) {
  OpenedCheckpoint oc = open_checkpoint(dir, files, target);
  HFCheckpoint ck;
  ck.config = oc.config;
  // File by file, in the order they were opened; each mapping is dropped once read.
  std::vector<std::vector<std::string>> by_file(oc.opened.size());
  for (const auto& [name, shape] : oc.expected) by_file[oc.where.at(name)].push_back(name);
  for (size_t i = 0; i < oc.opened.size(); ++i) {
    {
      const SafetensorsFile f = std::move(oc.opened[i]);
      for (const std::string& name : by_file[i]) {
        if (sink && sink->takes(name)) {
          // Straight from the mapped bytes, widened a range at a time as the sink asks.
          const Tensor t = f.tensor(oc.file_name(name));
          FT_CHECK(is_floating(t.dtype()), f.path() + ": tensor '" + name + "' is " +
                                               dtype_name(t.dtype()) + ", not a float type");
          const auto* bytes = static_cast<const uint8_t*>(t.raw());
          sink->put(name, t.shape(), [&](int64_t first, int64_t n, float* out) {
            widen_to_f32(bytes + size_t(first) * dtype_size(t.dtype()), t.dtype(), n, out);
          });
        } else {
          ck.tensors[name] = f.read(oc.file_name(name), target);
        }
        f.evict(oc.file_name(name));
        ck.source_file[name] = f.path();
      }
    }  // unmapped here (nothing borrows from it)
  }
  return ck;
}

namespace {

void write_checkpoint(const fs::path& dir, const ModelConfig& config,
                      const std::vector<TensorSource>& tensors, const SaveOptions& opt);

// A multimodal model's save: the text model's tensors under the names its source checkpoint
// uses, then that checkpoint's other tensors (vision tower, projector) as they are stored there
// (same bytes, same dtype).
std::vector<TensorSource> with_carried_tensors(const ModelConfig& config,
                                               const std::vector<TensorSource>& text) {
  auto source = std::make_shared<TensorFiles>(
      open_tensor_files(config.multimodal_source_dir, config.multimodal_source_files));
  const MultimodalNames names = multimodal_names(source->where);
  std::vector<TensorSource> out;
  for (TensorSource t : text) {
    t.name = names.stored_name(t.name);
    out.push_back(std::move(t));
  }
  for (const auto& [name, i] : source->where) {
    if (!names.text_name(name).empty()) continue;
    const TensorInfo& info = source->opened[i].info(name);
    out.push_back({name, info.shape, info.dtype,
                   [source, i = i, name = name] { return source->opened[i].tensor(name); },
                   /*keep_dtype=*/true});
  }
  return out;
}

}  // namespace

void save_hf_checkpoint(const fs::path& dir, const ModelConfig& config, const NamedTensors& tensors,
                        const SaveOptions& opt) {
  std::vector<TensorSource> sources;
  sources.reserve(tensors.size());
  for (const auto& [name, t] : tensors) {
    FT_CHECK(t.defined(), "save " + dir.string() + ": tensor '" + name + "' is undefined");
    sources.push_back({name, t.shape(), t.dtype(), [t = t] { return t; }});
  }
  save_hf_checkpoint(dir, config, sources, opt);
}

void save_hf_checkpoint(const fs::path& dir, const ModelConfig& config,
                        const std::vector<TensorSource>& tensors, const SaveOptions& opt) {
  const std::string out = dir.string();
  validate_model_config(config, out + "/config.json");
  FT_CHECK(is_floating(opt.dtype), std::string("cannot save a checkpoint as ") +
                                       dtype_name(opt.dtype) + " (not a float type)");
  FT_CHECK(opt.max_shard_bytes > 0, "max_shard_bytes must be positive");

  // The tensors must be exactly the model's parameters, so the result loads again.
  const auto expected = expected_parameters(config);
  std::map<std::string, Shape> want(expected.begin(), expected.end());
  std::set<std::string> seen;
  for (const auto& t : tensors) {
    const std::string& name = t.name;
    FT_CHECK(seen.insert(name).second, "save " + out + ": tensor '" + name + "' given twice");
    FT_CHECK(bool(t.produce), "save " + out + ": tensor '" + name + "' is undefined");
    auto w = want.find(name);
    FT_CHECK(w != want.end(), "save " + out + ": '" + name + "' is not a parameter of this " +
                                  config.model_type + " model");
    FT_CHECK(t.shape == w->second, "save " + out + ": tensor '" + name + "' has shape " +
                                       shape_str(t.shape) + " but the config implies " +
                                       shape_str(w->second));
    FT_CHECK(is_floating(t.dtype), "save " + out + ": tensor '" + name + "' has dtype " +
                                       dtype_name(t.dtype) + ", expected a float type");
  }
  for (const auto& [name, shape] : expected)
    FT_CHECK(seen.count(name), "save " + out + ": tensor '" + name + "' is missing");
  if (!config.multimodal.is_object()) return write_checkpoint(dir, config, tensors, opt);
  if (!config.multimodal_source_dir.empty())
    return write_checkpoint(dir, config, with_carried_tensors(config, tensors), opt);
  // No checkpoint to take the vision tensors from (a model built from a config.json file).
  ModelConfig text = config;
  text.multimodal = nullptr;
  text.ids_from_multimodal.clear();
  std::fprintf(stderr,
               "note: save %s: no %s checkpoint to carry the vision tensors from: writing the "
               "text model alone (%s)\n",
               out.c_str(), config.multimodal.value("model_type", "").c_str(),
               std::string(model_family(text.model_type).hf_architecture).c_str());
  write_checkpoint(dir, text, tensors, opt);
}

namespace {

void write_checkpoint(const fs::path& dir, const ModelConfig& config,
                      const std::vector<TensorSource>& tensors, const SaveOptions& opt) {
  const std::string out = dir.string();
  // Replacing a directory drops everything in it: only ever replace a checkpoint.
  std::error_code ec;
  if (fs::exists(dir, ec)) {
    FT_CHECK(fs::is_directory(dir, ec), "cannot save checkpoint: '" + out + "' is not a directory");
    FT_CHECK(fs::is_empty(dir, ec) || fs::exists(dir / "config.json", ec),
             "refusing to replace '" + out +
                 "': it is not empty and holds no config.json, so it is not a checkpoint");
  }
  if (!opt.copy_files_from.empty())
    FT_CHECK(fs::is_directory(opt.copy_files_from, ec),
             "copy_files_from '" + opt.copy_files_from.string() + "' is not a directory");

  // Shards: greedy in the given order; a tensor larger than the limit gets a shard of its own.
  std::vector<std::vector<TensorSource>> shards(1);
  int64_t shard_bytes = 0, total = 0;
  for (const auto& nt : tensors) {
    const int64_t bytes = shape_numel(nt.shape) * int64_t(dtype_size(opt.dtype));
    if (!shards.back().empty() && shard_bytes + bytes > opt.max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(nt);
    shard_bytes += bytes;
    total += bytes;
  }

  AtomicDirectory staging(dir);
  const std::map<std::string, std::string> meta = {{"format", "pt"}};
  json weight_map = json::object();
  for (size_t s = 0; s < shards.size(); ++s) {
    std::string name = "model.safetensors";
    if (shards.size() > 1) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", s + 1, shards.size());
      name = buf;
    }
    detail::write_safetensors(staging.path() / name, shards[s], meta, opt.dtype);
    for (const auto& nt : shards[s]) weight_map[nt.name] = name;
  }
  if (shards.size() > 1) {
    json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    write_text(staging.path() / "model.safetensors.index.json", index.dump(2) + "\n");
  }
  json cfg = model_config_to_json(config);
  cfg["torch_dtype"] = torch_dtype_name(opt.dtype);
  if (cfg.contains("dtype")) cfg["dtype"] = torch_dtype_name(opt.dtype);  // newer transformers
  write_text(staging.path() / "config.json", cfg.dump(2) + "\n");
  if (!opt.copy_files_from.empty()) {
    for (const auto& name : hf_side_files()) {
      const fs::path src = opt.copy_files_from / name;
      if (!fs::exists(src, ec)) continue;
      FT_CHECK(fs::is_regular_file(src, ec),
               "cannot copy '" + src.string() + "' into the checkpoint: not a regular file");
      write_text(staging.path() / name, read_file(src));
    }
  }
  staging.commit();
}

}  // namespace

}  // namespace fusetune
