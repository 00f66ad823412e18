// Damaged configs and overrides fail with fusetune::Error only: no other exception, no crash
// (run under ASan too). Deterministic mutations of the built-in configs.
#include <gtest/gtest.h>

#include <random>

#include "fusetune/config/builtin_configs.h"
#include "fusetune/config/recipe_schemas.h"
#include "fusetune/config/schema.h"
#include "fusetune/util/error.h"

using namespace fusetune;

namespace {

// Loads, overrides, resolves, validates and fills defaults; true when it all succeeded.
// Anything thrown other than fusetune::Error fails the test.
bool exercise(const std::string& text, const std::vector<std::string>& overrides) {
  try {
    Config c = Config::from_string(text, "mutated.yaml");
    c.apply_overrides(overrides);
    c.resolve();
    validate(c, lora_finetune_schema());
    Config f = with_defaults(c, lora_finetune_schema());
    (void)f.to_yaml();
    return true;
  } catch (const Error&) {
    return false;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "non-fusetune exception: " << e.what() << "\n--- text:\n" << text;
    return false;
  }
}

}  // namespace

TEST(ConfigRobustness, MutatedConfigsFailCleanly) {
  const std::string chars = "{}[]:,-#&*!|>'\"%@`${}.~=\n\t 0aZ\\";
  std::mt19937 rng(1234);
  for (const auto& b : builtin_configs()) {
    std::string base(b.text);
    for (int iter = 0; iter < 40; ++iter) {
      std::string t = base;
      int edits = 1 + static_cast<int>(rng() % 4);
      for (int e = 0; e < edits; ++e) {
        size_t pos = rng() % t.size();
        switch (rng() % 3) {
          case 0:
            t[pos] = chars[rng() % chars.size()];
            break;
          case 1:
            t.insert(pos, 1, chars[rng() % chars.size()]);
            break;
          default:
            t.erase(pos, 1 + rng() % 8);
            break;
        }
      }
      exercise(t, {});
    }
  }
}

TEST(ConfigRobustness, OddOverridesFailCleanly) {
  std::string base(find_builtin_config("llama3_2/1B_lora_single_device")->text);
  const std::vector<std::string> odd = {
      "=",
      "~",
      "~~a",
      "a=",
      "a.=1",
      ".a=1",
      "a=[",
      "a={",
      "a=}",
      "a=&x [*x]",
      "a=!!binary x",
      "model=[1,2]",
      "model.lora_rank=${model}",
      "x=${x}",
      "output_dir=${oc.env:}",
      "optimizer=${optimizer}",
      "dataset.source=${dataset}",
      "a=---\nb",
      "a=\"unterminated",
      "checkpointer.checkpoint_files={filename_format: '{}', max_filename: '-1'}",
      "model.lora_attn_modules=[[q_proj]]",
      "model.lora_attn_modules={a: 1}",
      "~model",
      "tokenizer=null",
      "dataset._component_=[a]",
      "optimizer._component_={a: b}",
      "metric_logger.log_dir=${output_dir}${output_dir}",
      "max_shard_size=1e400GB",
      "checkpointer.max_shard_size=1e400GB",
      "seed=99999999999999999999999"};
  for (const auto& o : odd) {
    SCOPED_TRACE(o);
    exercise(base, {o});
  }
}
