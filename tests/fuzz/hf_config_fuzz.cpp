// libFuzzer target: arbitrary bytes as config.json. Any input must parse into a valid
// ModelConfig or throw fusetune::Error; a parsed config must yield its parameter list and
// serialize back to JSON that parses to the same sizes.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include <nlohmann/json.hpp>

#include "fusetune/io/hf_checkpoint.h"
#include "fusetune/io/hf_config.h"
#include "fusetune/util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace fusetune;
  nlohmann::json j = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return 0;
  try {
    ModelConfig c = parse_model_config(j);
    if (c.num_hidden_layers <= 64) (void)expected_parameters(c);
    ModelConfig back = parse_model_config(model_config_to_json(c));
    if (back.hidden_size != c.hidden_size || back.head_dim != c.head_dim ||
        back.num_key_value_heads != c.num_key_value_heads ||
        back.rope_scaling.rope_type != c.rope_scaling.rope_type ||
        back.eos_token_id != c.eos_token_id || back.attention_bias != c.attention_bias)
      std::abort();  // model_config_to_json lost information
  } catch (const Error&) {
  }
  return 0;
}
