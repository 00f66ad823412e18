#include "fusetune/tokenizers/sentencepiece_tokenizer.h"

#include <sentencepiece_processor.h>

#include "fusetune/tokenizers/added_tokens.h"
#include "fusetune/tokenizers/utf8.h"
#include "fusetune/util/error.h"

namespace fusetune {

struct SentencePieceTokenizer::Impl {
  sentencepiece::SentencePieceProcessor sp;
  std::string path;
  AddedTokenMatcher specials;  // control + unknown pieces
  int32_t pad = 0;

  bool is_special(int id) const { return sp.IsControl(id) || sp.IsUnknown(id); }
};

SentencePieceTokenizer::SentencePieceTokenizer() : impl_(std::make_unique<Impl>()) {}
SentencePieceTokenizer::~SentencePieceTokenizer() = default;

std::unique_ptr<SentencePieceTokenizer> SentencePieceTokenizer::from_file(
    const std::filesystem::path& model) {
  FT_CHECK(std::filesystem::is_regular_file(model),
           "SentencePiece model not found at " + model.string());
  std::unique_ptr<SentencePieceTokenizer> tok(new SentencePieceTokenizer());
  Impl& m = *tok->impl_;
  m.path = model.string();
  auto status = m.sp.Load(m.path);
  FT_CHECK(status.ok(), "cannot load SentencePiece model " + m.path + ": " + status.ToString() +
                            " (expected a tokenizer.model protobuf file)");
  FT_CHECK(m.sp.GetPieceSize() > 0, "SentencePiece model " + m.path + " has no pieces");
  std::vector<AddedToken> specials;
  std::vector<std::string> patterns;
  for (int id = 0; id < m.sp.GetPieceSize(); ++id) {
    if (!m.is_special(id)) continue;
    AddedToken t;
    t.content = m.sp.IdToPiece(id);
    t.id = id;
    t.special = true;
    if (t.content.empty() || !utf8::is_valid(t.content)) continue;
    patterns.push_back(t.content);
    specials.push_back(std::move(t));
  }
  m.specials = AddedTokenMatcher(specials, patterns);
  m.pad = m.sp.pad_id() >= 0 ? m.sp.pad_id() : m.sp.eos_id() >= 0 ? m.sp.eos_id() : 0;
  return tok;
}

std::vector<int32_t> SentencePieceTokenizer::encode(std::string_view text, bool add_bos,
                                                    bool add_eos) const {
  const Impl& m = *impl_;
  std::string valid;
  if (!utf8::is_valid(text)) {
    valid = utf8::to_valid_lossy(text);
    text = valid;
  }
  std::vector<int32_t> ids;
  if (add_bos && m.sp.bos_id() >= 0) ids.push_back(m.sp.bos_id());
  std::vector<AddedTokenMatcher::Segment> segs;
  m.specials.split(text, segs);
  std::vector<int> piece_ids;
  for (const auto& seg : segs) {
    if (seg.id >= 0) {
      ids.push_back(seg.id);
      continue;
    }
    piece_ids.clear();
    auto status = m.sp.Encode(text.substr(seg.begin, seg.end - seg.begin), &piece_ids);
    FT_CHECK(status.ok(), "SentencePiece (" + m.path + ") failed to encode a text of " +
                              std::to_string(text.size()) + " bytes: " + status.ToString());
    ids.insert(ids.end(), piece_ids.begin(), piece_ids.end());
  }
  if (add_eos && m.sp.eos_id() >= 0) ids.push_back(m.sp.eos_id());
  return ids;
}

std::string SentencePieceTokenizer::decode(const std::vector<int32_t>& ids,
                                           bool skip_special_tokens) const {
  const Impl& m = *impl_;
  std::string out;
  std::vector<int> run;
  auto flush = [&] {
    if (run.empty()) return;
    std::string piece;
    auto status = m.sp.Decode(run, &piece);
    FT_CHECK(status.ok(), "SentencePiece (" + m.path + ") failed to decode: " + status.ToString());
    out += piece;
    run.clear();
  };
  for (int32_t id : ids) {
    if (id < 0 || id >= m.sp.GetPieceSize()) continue;
    if (m.is_special(id)) {
      flush();
      if (!skip_special_tokens) out += m.sp.IdToPiece(id);
      continue;
    }
    run.push_back(id);
  }
  flush();
  return out;
}

int64_t SentencePieceTokenizer::vocab_size() const { return impl_->sp.GetPieceSize(); }
int32_t SentencePieceTokenizer::bos_id() const { return impl_->sp.bos_id(); }
int32_t SentencePieceTokenizer::eos_id() const { return impl_->sp.eos_id(); }
int32_t SentencePieceTokenizer::pad_id() const { return impl_->pad; }

std::optional<int32_t> SentencePieceTokenizer::token_to_id(std::string_view token) const {
  int id = impl_->sp.PieceToId(token);
  // PieceToId answers unk_id for unknown pieces; only the unknown piece itself maps to it.
  if (id == impl_->sp.unk_id() && token != impl_->sp.IdToPiece(id)) return std::nullopt;
  return id;
}

}  // namespace fusetune
