#include "fusetune/tokenizers/hf_tokenizer.h"

#include <fstream>
#include <optional>
#include <sstream>
#include <unordered_map>

#include "fusetune/tokenizers/added_tokens.h"
#include "fusetune/tokenizers/bpe.h"
#include "fusetune/tokenizers/hf_decoder.h"
#include "fusetune/tokenizers/hf_json.h"
#include "fusetune/tokenizers/hf_normalizer.h"
#include "fusetune/tokenizers/hf_pretokenizer.h"
#include "fusetune/tokenizers/utf8.h"
#include "fusetune/util/fs.h"
#include "fusetune/util/strings.h"

namespace fusetune {

using hf_json::Json;
using hf_json::Where;

// The ids a template item adds: a post-processor's prefix and suffix around the text
// (outside the anonymous namespace: HfTokenizer::Impl holds one).
struct PostTemplate {
  std::vector<int32_t> prefix, suffix;
  bool present = false;  // the post-processor adds special tokens at all
};

namespace {

Json parse_json(std::string_view text, const std::string& file) {
  try {
    return Json::parse(text.begin(), text.end());
  } catch (const Json::exception& e) {  // parse_error, or out_of_range for huge numbers
    throw Error(file + " is not valid JSON: " + e.what());
  }
}

void read_post_processor(const Json& j, const Where& w, PostTemplate& t) {
  if (j.is_null()) return;
  const std::string type = hf_json::require_string(j, "type", w);
  if (type == "ByteLevel") return;  // only trims offsets, which we do not produce
  if (type == "Sequence") {
    const Json& arr = hf_json::require_array(j, "processors", w);
    for (size_t i = 0; i < arr.size(); ++i)
      read_post_processor(arr[i], (w / "processors").at(i), t);
    return;
  }
  if (type == "TemplateProcessing") {
    const Json& single = hf_json::require_array(j, "single", w);
    const Json& specials = hf_json::require(j, "special_tokens", w);
    PostTemplate local;
    bool seen_a = false;
    for (size_t i = 0; i < single.size(); ++i) {
      Where wi = (w / "single").at(i);
      const Json& item = single[i];
      FT_CHECK(item.is_object(), wi.str() + " must be an object");
      if (item.contains("Sequence")) {
        seen_a = true;
        continue;
      }
      const Json& st = hf_json::require_object(item, "SpecialToken", wi);
      const std::string name = hf_json::require_string(st, "id", wi / "SpecialToken");
      FT_CHECK(specials.is_object() && specials.contains(name),
               (w / "special_tokens").str() + " has no entry '" + name + "' used by " + wi.str());
      const Json& ids = hf_json::require_array(specials[name], "ids", w / "special_tokens" / name);
      for (const Json& id : ids) {
        FT_CHECK(id.is_number_integer(),
                 (w / "special_tokens" / name).str() + ".ids must be integers");
        (seen_a ? local.suffix : local.prefix).push_back(id.get<int32_t>());
      }
    }
    t.prefix.insert(t.prefix.begin(), local.prefix.begin(), local.prefix.end());
    t.suffix.insert(t.suffix.end(), local.suffix.begin(), local.suffix.end());
    t.present = true;
    return;
  }
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    auto pair_id = [&](const char* key) {
      const Json& p = hf_json::require_array(j, key, w);
      FT_CHECK(p.size() == 2 && p[1].is_number_integer(), (w / key).str() + " must be [token, id]");
      return p[1].get<int32_t>();
    };
    t.prefix.insert(t.prefix.begin(), pair_id("cls"));
    t.suffix.push_back(pair_id("sep"));
    t.present = true;
    return;
  }
  throw Error(w.str() + ": post_processor type '" + type +
              "' is not supported (supported: TemplateProcessing, ByteLevel, RobertaProcessing, "
              "BertProcessing, Sequence)");
}

// A special-token entry of tokenizer_config.json: "tok", {"content": "tok", ...} or null.
std::optional<std::string> config_token(const Json& cfg, const char* key, const Where& w) {
  auto it = cfg.find(key);
  if (it == cfg.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) return hf_json::require_string(*it, "content", w / key);
  throw Error((w / key).str() + " must be a string, an object with \"content\", or null");
}

// tokenizer_config.json's text (may be empty) as an object.
Json parse_config(std::string_view config_json, const std::string& name) {
  Json cfg = Json::object();
  const std::string cfg_name = "tokenizer_config.json beside " + name;
  if (!config_json.empty()) {
    cfg = parse_json(config_json, cfg_name);
    FT_CHECK(cfg.is_object(), cfg_name + " must be a JSON object");
  }
  return cfg;
}

}  // namespace

struct HfTokenizer::Impl {
  std::string name;
  std::unique_ptr<BpeModel> model;
  std::unique_ptr<HfNormalizer> normalizer;
  std::unique_ptr<HfPreTokenizer> pre_tokenizer;
  std::unique_ptr<HfDecoder> decoder;
  std::vector<AddedToken> added;
  std::unordered_map<int32_t, size_t> added_by_id;  // id -> index into added
  StringMap<int32_t> added_by_content;
  AddedTokenMatcher raw_matcher, normalized_matcher;
  PostTemplate post;
  int32_t bos = -1, eos = -1, pad = -1;
  std::optional<bool> cfg_add_bos, cfg_add_eos;
  int64_t vocab_size = 0;

  std::optional<int32_t> lookup(std::string_view token) const {
    auto it = added_by_content.find(token);
    if (it != added_by_content.end()) return it->second;
    return model->token_to_id(token);
  }

  void encode_text(std::string_view text, std::vector<int32_t>& ids) const;
  // Everything after the model: normalizer, pre-tokenizer, decoder, post-processor and added
  // tokens of `root`, then BOS/EOS/PAD from `cfg` (tokenizer_config.json). With
  // ids_as_written the added tokens take their "id" fields (from_parts).
  void assemble(const Json& root, const Json& cfg, const Where& w, bool ids_as_written);
};

HfTokenizer::HfTokenizer() : impl_(std::make_unique<Impl>()) {}
HfTokenizer::~HfTokenizer() = default;

std::unique_ptr<HfTokenizer> HfTokenizer::from_file(const std::filesystem::path& path) {
  const std::string json = read_input_file(path, "tokenizer.json");
  std::string config;
  std::filesystem::path dir = path.parent_path();
  if (dir.empty()) dir = ".";
  const std::filesystem::path cfg_path = dir / "tokenizer_config.json";
  const std::filesystem::path map_path = dir / "special_tokens_map.json";
  Json cfg = Json::object();
  if (std::filesystem::exists(cfg_path)) {
    cfg = parse_json(read_input_file(cfg_path, "tokenizer_config.json"),
                     "tokenizer_config.json at " + cfg_path.string());
    FT_CHECK(cfg.is_object(),
             "tokenizer_config.json at " + cfg_path.string() + " must be an object");
  }
  // special_tokens_map.json fills in the tokens tokenizer_config.json does not name.
  if (std::filesystem::exists(map_path)) {
    Json map = parse_json(read_input_file(map_path, "special_tokens_map.json"),
                          "special_tokens_map.json at " + map_path.string());
    if (map.is_object())
      for (const char* key : {"bos_token", "eos_token", "pad_token", "unk_token"})
        if (map.contains(key) && !cfg.contains(key)) cfg[key] = map[key];
  }
  return from_json(json, cfg.empty() ? std::string() : cfg.dump(),
                   "tokenizer.json at " + path.string());
}

std::unique_ptr<HfTokenizer> HfTokenizer::from_json(std::string_view tokenizer_json,
                                                    std::string_view config_json,
                                                    const std::string& name) {
  std::unique_ptr<HfTokenizer> tok(new HfTokenizer());
  Impl& m = *tok->impl_;
  m.name = name;
  const Json root = parse_json(tokenizer_json, name);
  const Where w{name, ""};
  FT_CHECK(root.is_object(), name + " must be a JSON object, got " + root.type_name());
  try {
    // --- model ---
    const Json& model = hf_json::require_object(root, "model", w);
    const Where wm = w / "model";
    std::string type =
        hf_json::get_string(model, "type", model.contains("merges") ? "BPE" : "", wm);
    if (type != "BPE") {
      throw Error(wm.str() + ": model type '" + (type.empty() ? "(none)" : type) +
                  "' is not supported; fusetune reads BPE tokenizer.json files (byte-level like "
                  "GPT-2 / Llama 3 / Qwen, or SentencePiece-style like Llama 2)" +
                  (type == "Unigram" ? "; for a SentencePiece Unigram model load its "
                                       "tokenizer.model with tokenizer type 'sentencepiece'"
                                     : ""));
    }
    const Json& vocab_j = hf_json::require_object(model, "vocab", wm);
    StringMap<int32_t> vocab;
    vocab.reserve(vocab_j.size());
    for (auto it = vocab_j.begin(); it != vocab_j.end(); ++it) {
      FT_CHECK(it.value().is_number_integer(),
               (wm / "vocab").str() + ": token '" + it.key() + "' must map to an integer id");
      vocab.emplace(it.key(), it.value().get<int32_t>());
    }
    std::vector<std::pair<std::string, std::string>> merges;
    const Json& merges_j = hf_json::require_array(model, "merges", wm);
    merges.reserve(merges_j.size());
    for (size_t i = 0; i < merges_j.size(); ++i) {
      const Json& e = merges_j[i];
      const Where wi = (wm / "merges").at(i);
      if (e.is_string()) {
        const std::string& s = e.get_ref<const std::string&>();
        size_t sp = s.find(' ');
        FT_CHECK(sp != std::string::npos && sp > 0 && sp + 1 < s.size() &&
                     s.find(' ', sp + 1) == std::string::npos,
                 wi.str() + " '" + s + "' must be two tokens separated by one space");
        merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
      } else {
        FT_CHECK(e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string(),
                 wi.str() + " must be \"a b\" or [\"a\", \"b\"]");
        merges.emplace_back(e[0].get<std::string>(), e[1].get<std::string>());
      }
    }
    BpeOptions opt;
    if (model.contains("unk_token") && !model["unk_token"].is_null())
      opt.unk_token = hf_json::get_string(model, "unk_token", "", wm);
    opt.fuse_unk = hf_json::get_bool(model, "fuse_unk", false, wm);
    opt.byte_fallback = hf_json::get_bool(model, "byte_fallback", false, wm);
    opt.ignore_merges = hf_json::get_bool(model, "ignore_merges", false, wm);
    opt.continuing_subword_prefix = hf_json::get_string(model, "continuing_subword_prefix", "", wm);
    opt.end_of_word_suffix = hf_json::get_string(model, "end_of_word_suffix", "", wm);
    // "dropout" is a training-time regularizer of BPE; encoding here is deterministic.
    m.model = std::make_unique<BpeModel>(std::move(vocab), merges, std::move(opt), name);

    tok->impl_->assemble(root, parse_config(config_json, name), w, false);
  } catch (const Json::exception& e) {
    // Backstop for a value of an unexpected JSON type that no check above anticipated.
    throw Error(name + ": unexpected JSON value: " + e.what());
  }
  return tok;
}

std::unique_ptr<HfTokenizer> HfTokenizer::from_parts(std::unique_ptr<BpeModel> model,
                                                     const Json& pipeline, const Json& config,
                                                     const std::string& name) {
  std::unique_ptr<HfTokenizer> tok(new HfTokenizer());
  Impl& m = *tok->impl_;
  m.name = name;
  m.model = std::move(model);
  FT_CHECK(pipeline.is_object() && config.is_object(),
           name + ": the pipeline and config must be JSON objects");
  try {
    m.assemble(pipeline, config, Where{name, ""}, true);
  } catch (const Json::exception& e) {
    throw Error(name + ": unexpected JSON value: " + e.what());
  }
  return tok;
}

void HfTokenizer::Impl::assemble(const Json& root, const Json& cfg, const Where& w,
                                 bool ids_as_written) {
  Impl& m = *this;
  // --- pipeline ---
  m.normalizer = make_hf_normalizer(root.value("normalizer", Json()), w / "normalizer");
  m.pre_tokenizer = make_hf_pre_tokenizer(root.value("pre_tokenizer", Json()), w / "pre_tokenizer");
  m.decoder = make_hf_decoder(root.value("decoder", Json()), w / "decoder");
  read_post_processor(root.value("post_processor", Json()), w / "post_processor", m.post);

  // --- added tokens ---
  // Ids as tokenizers assigns them on load (the "id" fields are not read back): a token
  // already in the model keeps its model id; any other takes the next id after the model's
  // entry count and the added ids so far. Real files agree with their "id" fields.
  // from_parts (ids_as_written) takes the "id" fields instead.
  int32_t max_id = m.model->max_id();
  const int64_t model_size = int64_t(m.model->size());
  std::optional<int64_t> max_added;
  if (root.contains("added_tokens") && !root["added_tokens"].is_null()) {
    const Json& arr = hf_json::require_array(root, "added_tokens", w);
    for (size_t i = 0; i < arr.size(); ++i) {
      const Where wi = (w / "added_tokens").at(i);
      const Json& a = arr[i];
      AddedToken t;
      t.content = hf_json::require_string(a, "content", wi);
      FT_CHECK(!a.contains("id") || a["id"].is_number_integer(),
               (wi / "id").str() + " must be an integer");
      t.special = hf_json::get_bool(a, "special", false, wi);
      t.lstrip = hf_json::get_bool(a, "lstrip", false, wi);
      t.rstrip = hf_json::get_bool(a, "rstrip", false, wi);
      t.single_word = hf_json::get_bool(a, "single_word", false, wi);
      t.normalized = hf_json::get_bool(a, "normalized", !t.special, wi);
      FT_CHECK(!t.content.empty(), (wi / "content").str() + " must not be empty");
      FT_CHECK(utf8::is_valid(t.content), (wi / "content").str() + " is not valid UTF-8");
      if (m.added_by_content.count(t.content)) continue;  // a repeat: the first one stands
      int64_t id;
      if (ids_as_written) {
        FT_CHECK(a.contains("id"), (wi / "id").str() + " is missing");
        id = a["id"].get<int64_t>();
        FT_CHECK(id >= 0 && id < (int64_t(1) << 30),
                 (wi / "id").str() + " " + std::to_string(id) + " is out of range");
        const std::string* in_model = m.model->id_to_token(int32_t(id));
        FT_CHECK(!in_model || *in_model == t.content,
                 wi.str() + ": special token '" + t.content + "' has id " + std::to_string(id) +
                     ", which the vocabulary already gives to another token");
        auto other = m.added_by_id.find(int32_t(id));
        FT_CHECK(other == m.added_by_id.end(),
                 wi.str() + ": special tokens '" + m.added[other->second].content + "' and '" +
                     t.content + "' have the same id " + std::to_string(id));
      } else if (auto model_id = m.model->token_to_id(t.content)) {
        id = *model_id;
      } else if (!max_added) {
        id = model_size;
      } else {
        id = (*max_added >= model_size || model_size == 0) ? *max_added + 1 : model_size;
      }
      FT_CHECK(id < (int64_t(1) << 30), wi.str() + ": too many added tokens");
      max_added = std::max(max_added.value_or(id), id);
      t.id = int32_t(id);
      max_id = std::max(max_id, t.id);
      m.added_by_id.emplace(t.id, m.added.size());
      m.added_by_content[t.content] = t.id;
      m.added.push_back(std::move(t));
    }
  }
  std::vector<std::string> raw_patterns, norm_patterns;
  for (const AddedToken& t : m.added) {
    if (t.normalized) {
      std::string p = t.content;
      if (m.normalizer) m.normalizer->normalize(p);
      raw_patterns.emplace_back();
      norm_patterns.push_back(std::move(p));
    } else {
      raw_patterns.push_back(t.content);
      norm_patterns.emplace_back();
    }
  }
  m.raw_matcher = AddedTokenMatcher(m.added, raw_patterns);
  m.normalized_matcher = AddedTokenMatcher(m.added, norm_patterns);
  m.vocab_size = int64_t(max_id) + 1;
  for (int32_t id : m.post.prefix)
    FT_CHECK(id >= 0 && id <= max_id, (w / "post_processor").str() + " adds id " +
                                          std::to_string(id) + ", outside the vocabulary");
  for (int32_t id : m.post.suffix)
    FT_CHECK(id >= 0 && id <= max_id, (w / "post_processor").str() + " adds id " +
                                          std::to_string(id) + ", outside the vocabulary");

  // --- tokenizer_config.json ---
  const Where wc{"tokenizer_config.json beside " + m.name, ""};
  auto resolve = [&](const char* key) -> std::optional<int32_t> {
    auto tokname = config_token(cfg, key, wc);
    if (!tokname) return std::nullopt;
    auto id = m.lookup(*tokname);
    FT_CHECK(id, (wc / key).str() + " '" + *tokname + "' is not a token of " + m.name);
    return id;
  };
  auto bos_tok = resolve("bos_token"), eos_tok = resolve("eos_token"),
       pad_tok = resolve("pad_token");
  // Without a configured BOS/EOS, the post-processor's template names them.
  if (!cfg.contains("bos_token") && m.post.prefix.size() == 1) bos_tok = m.post.prefix[0];
  if (!cfg.contains("eos_token") && m.post.suffix.size() == 1) eos_tok = m.post.suffix[0];
  m.bos = bos_tok.value_or(-1);
  m.eos = eos_tok.value_or(-1);
  m.pad = pad_tok ? *pad_tok : m.eos >= 0 ? m.eos : 0;
  if (cfg.contains("add_bos_token") && !cfg["add_bos_token"].is_null())
    m.cfg_add_bos = hf_json::get_bool(cfg, "add_bos_token", false, wc);
  if (cfg.contains("add_eos_token") && !cfg["add_eos_token"].is_null())
    m.cfg_add_eos = hf_json::get_bool(cfg, "add_eos_token", false, wc);
}

void HfTokenizer::Impl::encode_text(std::string_view text, std::vector<int32_t>& ids) const {
  std::string valid;
  if (!utf8::is_valid(text)) {
    valid = utf8::to_valid_lossy(text);
    text = valid;
  }
  // Scratch buffers reused across calls on this thread.
  thread_local std::vector<AddedTokenMatcher::Segment> segs, subs;
  thread_local std::vector<PreToken> pieces;
  thread_local std::string norm;
  segs.clear();
  raw_matcher.split(text, segs);
  for (const auto& seg : segs) {
    if (seg.id >= 0) {
      ids.push_back(seg.id);
      continue;
    }
    norm.assign(text.substr(seg.begin, seg.end - seg.begin));
    if (normalizer) normalizer->normalize(norm);
    subs.clear();
    normalized_matcher.split(norm, subs);
    for (const auto& sub : subs) {
      if (sub.id >= 0) {
        ids.push_back(sub.id);
        continue;
      }
      pieces.clear();
      pieces.push_back(
          {norm.substr(sub.begin, sub.end - sub.begin), seg.begin == 0 && sub.begin == 0});
      if (pre_tokenizer) pre_tokenizer->pre_tokenize(pieces);
      for (const PreToken& p : pieces) model->encode_word(p.text, ids);
    }
  }
}

std::vector<int32_t> HfTokenizer::encode(std::string_view text, bool add_bos, bool add_eos) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  if (add_bos && impl_->bos >= 0) ids.push_back(impl_->bos);
  impl_->encode_text(text, ids);
  if (add_eos && impl_->eos >= 0) ids.push_back(impl_->eos);
  return ids;
}

std::vector<int32_t> HfTokenizer::encode_with_special_tokens(std::string_view text) const {
  const Impl& m = *impl_;
  std::vector<int32_t> ids;
  if (m.cfg_add_bos) {
    if (*m.cfg_add_bos && m.bos >= 0) ids.push_back(m.bos);
  } else {
    ids = m.post.prefix;
  }
  m.encode_text(text, ids);
  if (m.cfg_add_eos) {
    if (*m.cfg_add_eos && m.eos >= 0) ids.push_back(m.eos);
  } else {
    ids.insert(ids.end(), m.post.suffix.begin(), m.post.suffix.end());
  }
  return ids;
}

std::string HfTokenizer::decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  const Impl& m = *impl_;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    auto it = m.added_by_id.find(id);
    if (it != m.added_by_id.end()) {
      const AddedToken& t = m.added[it->second];
      if (!(skip_special_tokens && t.special)) tokens.push_back(t.content);
      continue;
    }
    if (const std::string* s = m.model->id_to_token(id)) tokens.push_back(*s);
  }
  if (!m.decoder) return join(tokens, " ");  // tokenizers' behavior without a decoder
  m.decoder->decode_chain(tokens);
  std::string out;
  for (const auto& t : tokens) out += t;
  return out;
}

int64_t HfTokenizer::vocab_size() const { return impl_->vocab_size; }
int32_t HfTokenizer::bos_id() const { return impl_->bos; }
int32_t HfTokenizer::eos_id() const { return impl_->eos; }
int32_t HfTokenizer::pad_id() const { return impl_->pad; }

bool HfTokenizer::default_add_bos() const {
  if (impl_->cfg_add_bos) return *impl_->cfg_add_bos && impl_->bos >= 0;
  return !impl_->post.prefix.empty();
}

bool HfTokenizer::default_add_eos() const {
  if (impl_->cfg_add_eos) return *impl_->cfg_add_eos && impl_->eos >= 0;
  return !impl_->post.suffix.empty();
}

std::optional<int32_t> HfTokenizer::token_to_id(std::string_view token) const {
  return impl_->lookup(token);
}

std::optional<std::string> HfTokenizer::id_to_token(int32_t id) const {
  auto it = impl_->added_by_id.find(id);
  if (it != impl_->added_by_id.end()) return impl_->added[it->second].content;
  if (const std::string* s = impl_->model->id_to_token(id)) return *s;
  return std::nullopt;
}

bool HfTokenizer::is_special(int32_t id) const {
  auto it = impl_->added_by_id.find(id);
  return it != impl_->added_by_id.end() && impl_->added[it->second].special;
}

}  // namespace fusetune
