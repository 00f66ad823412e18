#include "fusetune/tokenizers/unicode_normalize.h"

#include <unicode/bytestream.h>
#include <unicode/locid.h>
#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>

#include "fusetune/util/error.h"

namespace fusetune::unicode {
namespace {

bool is_ascii(std::string_view s) {
  for (char c : s)
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  return true;
}

const icu::Normalizer2& instance(NormalForm form) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* n = nullptr;
  switch (form) {
    case NormalForm::NFC:
      n = icu::Normalizer2::getNFCInstance(status);
      break;
    case NormalForm::NFD:
      n = icu::Normalizer2::getNFDInstance(status);
      break;
    case NormalForm::NFKC:
      n = icu::Normalizer2::getNFKCInstance(status);
      break;
    case NormalForm::NFKD:
      n = icu::Normalizer2::getNFKDInstance(status);
      break;
  }
  FT_CHECK(U_SUCCESS(status) && n, "ICU normalizer unavailable: " + u_errorName(status));
  return *n;
}

}  // namespace

std::string normalize(std::string_view utf8, NormalForm form) {
  if (is_ascii(utf8)) return std::string(utf8);
  const icu::Normalizer2& n = instance(form);
  std::string out;
  out.reserve(utf8.size() + 8);
  icu::StringByteSink<std::string> sink(&out);
  UErrorCode status = U_ZERO_ERROR;
  n.normalizeUTF8(0, icu::StringPiece(utf8.data(), int32_t(utf8.size())), sink, nullptr, status);
  FT_CHECK(U_SUCCESS(status), "Unicode normalization failed: " + u_errorName(status));
  return out;
}

std::string to_lower(std::string_view utf8) {
  if (is_ascii(utf8)) {
    std::string out(utf8);
    for (char& c : out)
      if (c >= 'A' && c <= 'Z') c = char(c - 'A' + 'a');
    return out;
  }
  icu::UnicodeString u =
      icu::UnicodeString::fromUTF8(icu::StringPiece(utf8.data(), int32_t(utf8.size())));
  u.toLower(icu::Locale::getRoot());
  std::string out;
  u.toUTF8String(out);
  return out;
}

bool is_whitespace(char32_t cp) { return u_hasBinaryProperty(UChar32(cp), UCHAR_WHITE_SPACE); }

bool is_alphanumeric(char32_t cp) {
  return u_hasBinaryProperty(UChar32(cp), UCHAR_ALPHABETIC) ||
         (U_GET_GC_MASK(UChar32(cp)) & U_GC_N_MASK) != 0;
}

bool is_combining_mark(char32_t cp) { return (U_GET_GC_MASK(UChar32(cp)) & U_GC_M_MASK) != 0; }

}  // namespace fusetune::unicode
