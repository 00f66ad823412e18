#include "fusetune/recipes/kd_teacher_topk.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <string>

#include "fusetune/config/schema.h"
#include "fusetune/io/safetensors.h"
#include "fusetune/kernels/cpu/fused_linear_divergence.h"
#include "fusetune/util/crc32c.h"
#include "fusetune/util/error.h"

namespace fusetune {
namespace fs = std::filesystem;

namespace {

constexpr const char* kTopKFormat = "fusetune teacher top-k, version 1";

struct TopKFnv {
  uint64_t h = 1469598103934665603ull;
  void bytes(const void* p, size_t n) {
    const auto* c = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ c[i]) * 1099511628211ull;
  }
  void str(const std::string& s) {
    const uint64_t n = s.size();
    bytes(&n, sizeof n);
    bytes(s.data(), s.size());
  }
};

// A file's name, size and first MiB (a directory: each file in it, by name).
void hash_file_identity(TopKFnv& f, const fs::path& p) {
  if (fs::is_directory(p)) {
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(p))
      if (e.is_regular_file()) files.push_back(e.path());
    std::sort(files.begin(), files.end());
    for (const fs::path& file : files) hash_file_identity(f, file);
    return;
  }
  if (!fs::is_regular_file(p)) return;
  f.str(p.filename().string());
  const uint64_t size = fs::file_size(p);
  f.bytes(&size, sizeof size);
  std::ifstream in(p, std::ios::binary);
  std::string head(size_t(std::min<uint64_t>(size, 1 << 20)), '\0');
  in.read(head.data(), std::streamsize(head.size()));
  f.str(head);
}

// "<what> differs: the file has A, this run B", or nothing when equal.
void expect_same(const fs::path& file, const char* what, uint64_t has, uint64_t want,
                 const char* fix) {
  if (has == want) return;
  throw Error("teacher_logits: " + file.string() + " was computed for another " + what +
              " (the file's " + std::to_string(has) + ", this run's " + std::to_string(want) +
              "); " + fix);
}

}  // namespace

std::optional<TeacherLogitsOptions> teacher_logits_options(const Config& cfg, int64_t vocab_size) {
  if (!cfg.has("teacher_logits")) return std::nullopt;
  const Config t = cfg.sub("teacher_logits");
  TeacherLogitsOptions o;
  FT_CHECK(
      t.has("top_k"),
      t.where("top_k") + ": teacher_logits needs top_k (the teacher tokens kept per position)");
  o.top_k = t.i64("top_k");
  FT_CHECK(o.top_k >= 1 && o.top_k <= vocab_size,
           t.where("top_k") + ": teacher_logits.top_k must be in [1, " +
               std::to_string(vocab_size) + "] (the vocabulary), got " + std::to_string(o.top_k));
  o.precompute = t.boolean("precompute", false);
  if (o.precompute) {
    FT_CHECK(t.has("path"), t.where("precompute") +
                                ": teacher_logits.precompute needs teacher_logits.path (the "
                                "directory of the precomputed file)");
    o.path = t.str("path");
  } else {
    FT_CHECK(!t.has("path"),
             t.where("path") + ": teacher_logits.path is only read with precompute: true");
  }
  const std::string kind = canonical_component(cfg, "kd_loss");
  FT_CHECK(kind == "ForwardKLLoss",
           cfg.where("kd_loss") +
               ": teacher_logits.top_k restricts the teacher to its top-k "
               "tokens, where only the forward KL is defined (ForwardKLLoss), "
               "not " +
               kind);
  return o;
}

uint64_t dataset_fingerprint(const Dataset& d) {
  TopKFnv f;
  const int64_t n = d.size();
  f.bytes(&n, sizeof n);
  for (int64_t i = 0; i < n; ++i) {
    const Sample& s = d.get(i);
    const uint64_t len = s.tokens.size();
    f.bytes(&len, sizeof len);
    f.bytes(s.tokens.data(), s.tokens.size() * sizeof(int32_t));
    f.bytes(s.labels.data(), s.labels.size() * sizeof(int32_t));
  }
  return f.h;
}

uint64_t tokenizer_fingerprint(const Config& cfg) {
  TopKFnv f;
  if (!cfg.has("tokenizer")) return f.h;
  const Config t = cfg.sub("tokenizer");
  for (const std::string& key : t.keys())
    if (key != "path" && key != "max_seq_len") f.str(key + "=" + YAML::Dump(t.node(key)));
  if (t.has("path")) hash_file_identity(f, t.str("path"));
  return f.h;
}

uint64_t teacher_fingerprint(const Config& teacher_cfg) {
  TopKFnv f;
  f.str(YAML::Dump(teacher_cfg.node("model")));
  if (teacher_cfg.has("seed")) f.str(YAML::Dump(teacher_cfg.node("seed")));
  if (teacher_cfg.has("checkpointer.checkpoint_dir")) {
    const fs::path dir = teacher_cfg.str("checkpointer.checkpoint_dir");
    hash_file_identity(f, dir / "config.json");
    if (teacher_cfg.has("checkpointer.checkpoint_files"))
      for (const std::string& file : teacher_cfg.str_list("checkpointer.checkpoint_files"))
        hash_file_identity(f, dir / file);
    else
      hash_file_identity(f, dir);
  }
  return f.h;
}

TeacherTopK TeacherTopK::load(const fs::path& file, const TeacherTopKKey& want) {
  FT_CHECK(fs::is_regular_file(file),
           "teacher_logits: " + file.string() +
               " does not exist: set teacher_logits.precompute: true to compute it");
  const auto corrupt = [&](const std::string& why) {
    return Error("teacher_logits: " + file.string() + " is corrupt (" + why +
                 "): delete it to compute it again");
  };
  TeacherTopK t;
  try {
    t.file_ = std::make_shared<SafetensorsFile>(SafetensorsFile::open(file));
  } catch (const Error& e) {
    throw corrupt(e.what());
  }
  const std::map<std::string, std::string>& meta = t.file_->metadata();
  const auto field = [&](const std::string& key) -> uint64_t {
    const auto it = meta.find(key);
    if (it == meta.end()) throw corrupt("no '" + key + "' in its metadata");
    try {
      return std::stoull(it->second);
    } catch (const std::exception&) {
      throw corrupt("'" + key + "' is not a number");
    }
  };
  if (!meta.count("format") || meta.at("format") != kTopKFormat)
    throw corrupt("not a precomputed teacher top-k file");
  TeacherTopKKey& k = t.key_;
  k.top_k = int64_t(field("top_k"));
  k.vocab_size = int64_t(field("vocab_size"));
  k.samples = int64_t(field("samples"));
  k.dataset = field("dataset");
  k.tokenizer = field("tokenizer");
  k.teacher = field("teacher");
  const char* again = "delete it (or point teacher_logits.path elsewhere) to compute it again";
  expect_same(file, "top_k", uint64_t(k.top_k), uint64_t(want.top_k), again);
  expect_same(file, "vocabulary size", uint64_t(k.vocab_size), uint64_t(want.vocab_size), again);
  expect_same(file, "dataset (samples)", uint64_t(k.samples), uint64_t(want.samples), again);
  expect_same(file, "dataset (fingerprint)", k.dataset, want.dataset, again);
  expect_same(file, "tokenizer (fingerprint)", k.tokenizer, want.tokenizer, again);
  expect_same(file, "teacher (fingerprint)", k.teacher, want.teacher, again);
  for (const char* name : {"offsets", "ids", "logprobs"})
    if (!t.file_->has(name)) throw corrupt(std::string("no '") + name + "' tensor");
  t.offsets_ = t.file_->tensor("offsets");
  t.ids_ = t.file_->tensor("ids");
  t.logprobs_ = t.file_->tensor("logprobs");
  const int64_t rows = t.ids_.shape().empty() ? -1 : t.ids_.dim(0);
  if (t.offsets_.dtype() != DType::I64 || t.offsets_.shape() != Shape{k.samples + 1} ||
      t.ids_.dtype() != DType::I32 || t.ids_.shape() != Shape{rows, k.top_k} ||
      t.logprobs_.dtype() != DType::F32 || t.logprobs_.shape() != t.ids_.shape())
    throw corrupt("tensors of the wrong dtype or shape");
  for (const auto& [name, x] :
       {std::pair{"offsets", &t.offsets_}, {"ids", &t.ids_}, {"logprobs", &t.logprobs_}})
    if (crc32c(x->raw(), x->nbytes()) != uint32_t(field(std::string("crc32c_") + name)))
      throw corrupt("checksum mismatch");
  const int64_t* off = t.offsets_.data<int64_t>();
  for (int64_t i = 0; i < k.samples; ++i)
    if (off[i] > off[i + 1]) throw corrupt("sample offsets out of order");
  if (off[0] != 0 || off[k.samples] != rows) throw corrupt("sample offsets");
  const int32_t* id = t.ids_.data<int32_t>();
  for (int64_t i = 0; i < rows * k.top_k; ++i)
    if (id[i] < 0 || id[i] >= k.vocab_size) throw corrupt("a token id outside the vocabulary");
  return t;
}

void TeacherTopK::batch_inputs(const Batch& b, Tensor& ids, Tensor& logprobs) const {
  const int64_t B = b.batch_size, T = b.seq_len, K = key_.top_k;
  FT_CHECK(int64_t(b.items.size()) == B,
           "teacher_logits: a batch without its samples' indices (precomputed top-k)");
  ids = Tensor::zeros({B * T, K}, DType::I32);
  logprobs = Tensor::empty({B * T, K}, DType::F32);
  std::fill(logprobs.data<float>(), logprobs.data<float>() + B * T * K,
            float(kernels::kTopKFloorLogit));
  for (int64_t r = 0; r < B; ++r) {
    const int64_t s = b.items[size_t(r)];
    FT_CHECK(s >= 0 && s < key_.samples,
             "teacher_logits: sample " + std::to_string(s) + " is not in the precomputed file");
    const int64_t* off = offsets_.data<int64_t>();
    const int64_t first = off[s], n = std::min(T, off[s + 1] - first);
    std::memcpy(ids.data<int32_t>() + r * T * K, ids_.data<int32_t>() + first * K,
                size_t(n * K) * 4);
    std::memcpy(logprobs.data<float>() + r * T * K, logprobs_.data<float>() + first * K,
                size_t(n * K) * 4);
  }
}

void write_teacher_topk(const fs::path& file, const TeacherTopKKey& key, const Dataset& d,
                        const CollateOptions& collate, int64_t rows, const TopKOfBatch& top_k_of) {
  const int64_t K = key.top_k, n = d.size();
  FT_CHECK(key.samples == n, "write_teacher_topk: the key's sample count is not the dataset's");
  std::vector<int64_t> offsets{0};
  std::string ids_bytes, lp_bytes;
  for (int64_t s0 = 0; s0 < n; s0 += rows) {
    std::vector<const Sample*> items;
    for (int64_t s = s0; s < std::min(n, s0 + rows); ++s) items.push_back(&d.get(s));
    Batch b = fusetune::collate(items, collate);
    for (int64_t s = s0; s < std::min(n, s0 + rows); ++s) b.items.push_back(s);
    Tensor ids, lp;
    top_k_of(b, ids, lp);
    const Tensor lp32 = lp.to(DType::F32);
    for (size_t r = 0; r < items.size(); ++r) {
      const int64_t len = std::min<int64_t>(int64_t(items[r]->tokens.size()), b.seq_len);
      const int64_t at = int64_t(r) * b.seq_len * K;
      ids_bytes.append(reinterpret_cast<const char*>(ids.data<int32_t>() + at),
                       size_t(len * K) * 4);
      lp_bytes.append(reinterpret_cast<const char*>(lp32.data<float>() + at), size_t(len * K) * 4);
      offsets.push_back(offsets.back() + len);
    }
  }
  const int64_t total = offsets.back();  // token rows
  Tensor off = Tensor::empty({n + 1}, DType::I64), ids = Tensor::empty({total, K}, DType::I32);
  Tensor lp = Tensor::empty({total, K}, DType::F32);
  std::memcpy(off.raw(), offsets.data(), off.nbytes());
  std::memcpy(ids.raw(), ids_bytes.data(), ids.nbytes());
  std::memcpy(lp.raw(), lp_bytes.data(), lp.nbytes());
  std::map<std::string, std::string> meta = {{"format", kTopKFormat},
                                             {"top_k", std::to_string(key.top_k)},
                                             {"vocab_size", std::to_string(key.vocab_size)},
                                             {"samples", std::to_string(key.samples)},
                                             {"dataset", std::to_string(key.dataset)},
                                             {"tokenizer", std::to_string(key.tokenizer)},
                                             {"teacher", std::to_string(key.teacher)}};
  for (const auto& [name, x] : {std::pair{"offsets", &off}, {"ids", &ids}, {"logprobs", &lp}})
    meta[std::string("crc32c_") + name] = std::to_string(crc32c(x->raw(), x->nbytes()));
  fs::create_directories(file.parent_path());
  save_safetensors(file, {{"offsets", off}, {"ids", ids}, {"logprobs", lp}}, meta);
}

}  // namespace fusetune
