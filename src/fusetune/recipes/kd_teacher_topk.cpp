#include "fusetune/recipes/kd_teacher_topk.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <optional>
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

namespace {

constexpr const char* kTopKPartFormat = "fusetune teacher top-k part, version 1";

// Some of the file's batches, in batch order: each sample's token rows and their ids and
// log-probs (the tensors' bytes).
struct TopKRowBytes {
  std::vector<int64_t> lengths;
  std::string ids, logprobs;
};

// Batch k of the file is samples [k * rows, min(n, (k + 1) * rows)), however many ranks.
int64_t topk_batch_first(int64_t k, int64_t rows) { return k * rows; }
int64_t topk_batch_end(int64_t k, int64_t rows, int64_t n) { return std::min(n, (k + 1) * rows); }

void append_topk_batch(TopKRowBytes& out, const Dataset& d, const CollateOptions& collate,
                       int64_t s0, int64_t s1, int64_t K, const TopKOfBatch& top_k_of) {
  std::vector<const Sample*> items;
  for (int64_t s = s0; s < s1; ++s) items.push_back(&d.get(s));
  Batch b = fusetune::collate(items, collate);
  for (int64_t s = s0; s < s1; ++s) b.items.push_back(s);
  Tensor ids, lp;
  top_k_of(b, ids, lp);
  const Tensor lp32 = lp.to(DType::F32);
  for (size_t r = 0; r < items.size(); ++r) {
    const int64_t len = std::min<int64_t>(int64_t(items[r]->tokens.size()), b.seq_len);
    const int64_t at = int64_t(r) * b.seq_len * K;
    out.ids.append(reinterpret_cast<const char*>(ids.data<int32_t>() + at), size_t(len * K) * 4);
    out.logprobs.append(reinterpret_cast<const char*>(lp32.data<float>() + at),
                        size_t(len * K) * 4);
    out.lengths.push_back(len);
  }
}

// The batches k = shard, shard + shards, ... of the file.
TopKRowBytes compute_topk_share(const TeacherTopKKey& key, const Dataset& d,
                                const CollateOptions& collate, int64_t rows, int shard, int shards,
                                const TopKOfBatch& top_k_of) {
  const int64_t n = d.size();
  FT_CHECK(key.samples == n, "write_teacher_topk: the key's sample count is not the dataset's");
  FT_CHECK(rows >= 1 && shard >= 0 && shard < shards, "write_teacher_topk: bad batch split");
  TopKRowBytes out;
  for (int64_t k = shard; topk_batch_first(k, rows) < n; k += shards)
    append_topk_batch(out, d, collate, topk_batch_first(k, rows), topk_batch_end(k, rows, n),
                      key.top_k, top_k_of);
  return out;
}

std::map<std::string, std::string> topk_metadata(const char* format, const TeacherTopKKey& key) {
  return {{"format", format},
          {"top_k", std::to_string(key.top_k)},
          {"vocab_size", std::to_string(key.vocab_size)},
          {"samples", std::to_string(key.samples)},
          {"dataset", std::to_string(key.dataset)},
          {"tokenizer", std::to_string(key.tokenizer)},
          {"teacher", std::to_string(key.teacher)}};
}

// Writes `first` (offsets or lengths, I64) and the rows' ids and log-probs, with a CRC-32C of
// each tensor in the metadata.
void save_topk_rows(const fs::path& file, std::map<std::string, std::string> meta,
                    const char* first_name, const std::vector<int64_t>& first,
                    const TopKRowBytes& rows, int64_t K) {
  const int64_t total = int64_t(rows.ids.size() / 4) / K;  // token rows
  Tensor f = Tensor::empty({int64_t(first.size())}, DType::I64);
  Tensor ids = Tensor::empty({total, K}, DType::I32), lp = Tensor::empty({total, K}, DType::F32);
  std::memcpy(f.raw(), first.data(), f.nbytes());
  std::memcpy(ids.raw(), rows.ids.data(), ids.nbytes());
  std::memcpy(lp.raw(), rows.logprobs.data(), lp.nbytes());
  for (const auto& [name, x] : {std::pair{first_name, &f}, {"ids", &ids}, {"logprobs", &lp}})
    meta[std::string("crc32c_") + name] = std::to_string(crc32c(x->raw(), x->nbytes()));
  fs::create_directories(file.parent_path());
  save_safetensors(file, {{first_name, f}, {"ids", ids}, {"logprobs", lp}}, meta);
}

// The one-process file from all its rows, in sample order.
void save_topk_file(const fs::path& file, const TeacherTopKKey& key, const TopKRowBytes& all) {
  std::vector<int64_t> offsets{0};
  for (const int64_t len : all.lengths) offsets.push_back(offsets.back() + len);
  save_topk_rows(file, topk_metadata(kTopKFormat, key), "offsets", offsets, all, key.top_k);
}

// A part file read back (tensors over its mapping): its samples' lengths, ids and log-probs.
struct TopKPart {
  Tensor lengths, ids, logprobs;
  int64_t samples() const { return lengths.numel(); }
  int64_t rows() const { return ids.dim(0); }
};

// Reads a part and checks it was computed for this run's key, batches and split.
TopKPart read_topk_part(const fs::path& part, const TeacherTopKKey& key, int64_t rows, int shard,
                        int shards) {
  const auto bad = [&](const std::string& why) {
    return Error("teacher_logits: " + part.string() + " is not a part of this run's file (" + why +
                 "): delete it to compute it again");
  };
  std::map<std::string, std::string> want = topk_metadata(kTopKPartFormat, key);
  want["shard"] = std::to_string(shard);
  want["shards"] = std::to_string(shards);
  want["rows"] = std::to_string(rows);
  std::optional<SafetensorsFile> f;
  try {
    f = SafetensorsFile::open(part);
  } catch (const Error& e) {
    throw bad(e.what());
  }
  const std::map<std::string, std::string>& meta = f->metadata();
  for (const auto& [k, v] : want)
    if (!meta.count(k) || meta.at(k) != v) throw bad("its " + k);
  for (const char* name : {"lengths", "ids", "logprobs"})
    if (!f->has(name) || !meta.count(std::string("crc32c_") + name))
      throw bad(std::string("no '") + name + "'");
  TopKPart p{f->tensor("lengths"), f->tensor("ids"), f->tensor("logprobs")};
  if (p.lengths.dtype() != DType::I64 || p.lengths.shape().size() != 1 ||
      p.ids.dtype() != DType::I32 || p.ids.shape().size() != 2 || p.ids.dim(1) != key.top_k ||
      p.logprobs.dtype() != DType::F32 || p.logprobs.shape() != p.ids.shape())
    throw bad("tensors of the wrong dtype or shape");
  for (const auto& [name, x] :
       {std::pair{"lengths", &p.lengths}, {"ids", &p.ids}, {"logprobs", &p.logprobs}})
    if (std::to_string(crc32c(x->raw(), x->nbytes())) != meta.at(std::string("crc32c_") + name))
      throw bad("checksum mismatch");
  return p;
}

}  // namespace

void write_teacher_topk(const fs::path& file, const TeacherTopKKey& key, const Dataset& d,
                        const CollateOptions& collate, int64_t rows, const TopKOfBatch& top_k_of) {
  save_topk_file(file, key, compute_topk_share(key, d, collate, rows, 0, 1, top_k_of));
}

fs::path teacher_topk_part_file(const fs::path& file, int shard, int shards) {
  return file.parent_path() / (file.stem().string() + ".part-" + std::to_string(shard) + "-of-" +
                               std::to_string(shards) + ".safetensors");
}

void write_teacher_topk_part(const fs::path& file, const TeacherTopKKey& key, const Dataset& d,
                             const CollateOptions& collate, int64_t rows, int shard, int shards,
                             const TopKOfBatch& top_k_of) {
  const TopKRowBytes share = compute_topk_share(key, d, collate, rows, shard, shards, top_k_of);
  std::map<std::string, std::string> meta = topk_metadata(kTopKPartFormat, key);
  meta["shard"] = std::to_string(shard);
  meta["shards"] = std::to_string(shards);
  meta["rows"] = std::to_string(rows);
  save_topk_rows(teacher_topk_part_file(file, shard, shards), meta, "lengths", share.lengths, share,
                 key.top_k);
}

void merge_teacher_topk_parts(const fs::path& file, const TeacherTopKKey& key, int64_t rows,
                              int shards) {
  std::vector<TopKPart> parts;
  for (int p = 0; p < shards; ++p)
    parts.push_back(read_topk_part(teacher_topk_part_file(file, p, shards), key, rows, p, shards));
  const int64_t n = key.samples, row_bytes = key.top_k * 4;
  std::vector<int64_t> sample_at(size_t(shards), 0), row_at(size_t(shards), 0);
  TopKRowBytes all;
  // Batch k is part k % shards's next batch.
  for (int64_t k = 0; topk_batch_first(k, rows) < n; ++k) {
    const size_t p = size_t(k % shards);
    const TopKPart& part = parts[p];
    const auto short_part = [&] {
      return Error("teacher_logits: " + teacher_topk_part_file(file, int(p), shards).string() +
                   " is short of its batches: delete it to compute it again");
    };
    const int64_t count = topk_batch_end(k, rows, n) - topk_batch_first(k, rows);
    if (sample_at[p] + count > part.samples()) throw short_part();
    int64_t len = 0;
    for (int64_t i = 0; i < count; ++i) {
      const int64_t l = part.lengths.data<int64_t>()[sample_at[p] + i];
      all.lengths.push_back(l);
      len += l;
    }
    if (len < 0 || row_at[p] + len > part.rows()) throw short_part();
    const auto bytes_at = [&](const Tensor& x) {
      return static_cast<const char*>(x.raw()) + row_at[p] * row_bytes;
    };
    all.ids.append(bytes_at(part.ids), size_t(len * row_bytes));
    all.logprobs.append(bytes_at(part.logprobs), size_t(len * row_bytes));
    sample_at[p] += count;
    row_at[p] += len;
  }
  save_topk_file(file, key, all);
  parts.clear();
  for (int p = 0; p < shards; ++p) fs::remove(teacher_topk_part_file(file, p, shards));
}

}  // namespace fusetune
