#include "fusetune/data/byte_level.h"

#include "fusetune/data/utf8.h"

namespace fusetune::byte_level {
namespace {

struct Tables {
  std::array<std::string, 256> enc;
  std::array<int, 512> dec{};  // code points 0..511 cover the whole alphabet
  Tables() {
    dec.fill(-1);
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      // Printable Latin-1 bytes map to themselves, the others to 256 + n.
      bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      char32_t cp = printable ? char32_t(b) : char32_t(256 + n++);
      utf8::append(enc[b], cp);
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
  for (char c : bytes) out += t.enc[static_cast<unsigned char>(c)];
}

int decode_char(char32_t cp) { return cp < 512 ? tables().dec[cp] : -1; }

}  // namespace fusetune::byte_level
