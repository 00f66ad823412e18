#include "fusetune/tokenizers/byte_level.h"

#include "fusetune/tokenizers/utf8.h"

namespace fusetune::byte_level {
namespace {

struct Tables {
  std::array<std::string, 256> enc;
  std::array<char, 512> enc2{};  // the same, as two bytes (second unused for ASCII)
  std::array<unsigned char, 256> enc_len{};
  std::array<int, 512> dec{};  // code points 0..511 cover the whole alphabet
  Tables() {
    dec.fill(-1);
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      // Printable Latin-1 bytes map to themselves, the others to 256 + n.
      bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      char32_t cp = printable ? char32_t(b) : char32_t(256 + n++);
      utf8::append(enc[b], cp);
      enc_len[b] = static_cast<unsigned char>(enc[b].size());  // 1 or 2: code points < 0x800
      enc2[2 * b] = enc[b][0];
      enc2[2 * b + 1] = enc[b].size() > 1 ? enc[b][1] : 0;
      dec[cp] = b;
    }
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

}  // namespace

const std::string& encode_byte(unsigned char b) { return tables().enc[b]; }

void encode(std::string_view bytes, std::string& out) {
  const Tables& t = tables();
  size_t n = out.size();
  out.resize(n + 2 * bytes.size());
  char* dst = out.data() + n;
  for (char c : bytes) {
    const auto b = static_cast<unsigned char>(c);
    dst[0] = t.enc2[2 * b];
    dst[1] = t.enc2[2 * b + 1];
    dst += t.enc_len[b];
  }
  out.resize(size_t(dst - out.data()));
}

int decode_char(char32_t cp) { return cp < 512 ? tables().dec[cp] : -1; }

}  // namespace fusetune::byte_level
