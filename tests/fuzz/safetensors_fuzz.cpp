// libFuzzer target: arbitrary bytes through the safetensors parser. Any input must either
// parse or throw fusetune::Error; ASan flags every read outside the buffer. For inputs that
// parse, every tensor is materialized and every element read.
#include <cstddef>
#include <cstdint>

#include "fusetune/io/safetensors.h"
#include "fusetune/util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace fusetune;
  try {
    SafetensorsFile f = SafetensorsFile::from_memory(data, size, nullptr, "fuzz.safetensors");
    double sink = 0;
    for (const auto& name : f.names()) {
      const TensorInfo& info = f.info(name);
      if (info.end - info.begin > (64u << 20)) continue;  // valid but too big to copy quickly
      Tensor t = f.tensor(name);
      for (int64_t i = 0; i < t.numel(); ++i) sink += element_as_double(t, i);
    }
    for (const auto& [k, v] : f.metadata()) sink += double(k.size() + v.size());
    volatile double keep = sink;
    (void)keep;
  } catch (const Error&) {
    // Rejected cleanly: the expected outcome for most inputs.
  }
  return 0;
}
