// Damaged configs and overrides fail with fusetune::Error only: no other exception, no crash
// (run under ASan too), and a message that says where. Deterministic mutations of the
// built-in configs.
#include <gtest/gtest.h>

#include <random>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "checks.h"
#include "fusetune/config/builtin_configs.h"
#include "fusetune/config/recipe_schemas.h"
#include "fusetune/config/schema.h"
#include "fusetune/util/error.h"

using namespace fusetune;
using fusetune::testing::contains;

namespace {

// Loads, overrides, resolves, validates and fills defaults; the fusetune::Error's message,
// or "" when it all succeeded. Anything thrown other than fusetune::Error fails the test.
std::string exercise(const std::string& text, const std::vector<std::string>& overrides) {
  try {
    Config c = Config::from_string(text, "mutated.yaml");
    c.apply_overrides(overrides);
    c.resolve();
    validate(c, lora_finetune_schema());
    Config f = with_defaults(c, lora_finetune_schema());
    (void)f.to_yaml();
    return "";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_FALSE(what.empty()) << "an Error without a message\n--- text:\n" << text;
    return what.empty() ? "(empty)" : what;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "non-fusetune exception: " << e.what() << "\n--- text:\n" << text;
    return "(non-fusetune exception)";
  }
}

size_t line_count(const std::string& text) {
  size_t n = 1;
  for (char c : text) n += c == '\n';
  return n;
}

}  // namespace

// Every failure names the file ("mutated.yaml", with a line that exists in the text where it
// gives one); a list of problems has as many entries as its count says, each naming where.
TEST(ConfigRobustness, MutatedConfigsFailCleanly) {
  const std::string chars = "{}[]:,-#&*!|>'\"%@`${}.~=\n\t 0aZ\\";
  const std::regex problems_head(
      R"(^mutated\.yaml: (\d+) problems? in the config for recipe lora_finetune_single_device:)");
  const std::regex line_ref(R"(mutated\.yaml:(\d+))");
  std::mt19937 rng(1234);
  int ok = 0, problem_lists = 0, yaml_errors = 0, other = 0;
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
      const std::string msg = exercise(t, {});
      if (msg.empty()) {
        ++ok;
        continue;
      }
      SCOPED_TRACE("message: " + msg + "\n--- text:\n" + t);
      EXPECT_TRUE(contains(msg, "mutated.yaml"));
      for (auto it = std::sregex_iterator(msg.begin(), msg.end(), line_ref);
           it != std::sregex_iterator(); ++it) {
        const size_t line = std::stoul((*it)[1]);
        EXPECT_GE(line, 1u);
        EXPECT_LE(line, line_count(t));
      }
      std::smatch head;
      if (std::regex_search(msg, head, problems_head)) {
        ++problem_lists;
        const size_t count = std::stoul(head[1]);
        EXPECT_TRUE(contains(head[0].str(), count == 1 ? " problem in " : " problems in "));
        std::vector<std::string> entries;
        for (size_t at = msg.find("\n  - "); at != std::string::npos;) {
          const size_t next = msg.find("\n  - ", at + 1);
          entries.push_back(msg.substr(at + 5, next == std::string::npos ? next : next - at - 5));
          at = next;
        }
        EXPECT_EQ(entries.size(), count);
        for (const std::string& entry : entries) EXPECT_TRUE(contains(entry, "(mutated.yaml"));
      } else if (contains(msg, "invalid YAML")) {
        ++yaml_errors;
        EXPECT_TRUE(
            std::regex_search(msg, std::regex(R"(^mutated\.yaml:\d+:\d+: invalid YAML: )")));
      } else {
        ++other;  // duplicate keys, a config that is no map, interpolation
      }
    }
  }
  // The mutations reach every kind of failure (and leave some configs valid).
  EXPECT_GT(ok, 0);
  EXPECT_GT(problem_lists, 100);
  EXPECT_GT(yaml_errors, 100);
  EXPECT_GT(other, 10);
}

// Each odd override fails with a message naming it (or, for the deletion, the key it
// deleted), or is accepted where it is valid YAML for a key that takes it.
TEST(ConfigRobustness, OddOverridesFailCleanly) {
  std::string base(find_builtin_config("llama3_2/1B_lora_single_device")->text);
  const std::vector<std::pair<std::string, std::string>> odd = {
      {"=", "override '=': '' is not a config key"},
      {"~", "override '~': '' is not a config key"},
      {"~~a", "override '~~a': '~a' is not a config key"},
      {"a=", "unknown config key 'a' (override 'a=')"},
      {"a.=1", "override 'a.=1': 'a.' is not a config key"},
      {".a=1", "override '.a=1': '.a' is not a config key"},
      {"a=[", "override 'a=[': the value is not valid YAML"},
      {"a={", "override 'a={': the value is not valid YAML"},
      {"a=}", "override 'a=}': the value is not valid YAML"},
      {"a=&x [*x]", "override 'a=&x [*x]':1: recursive YAML alias"},
      {"a=!!binary x", "unknown config key 'a' (override 'a=!!binary x')"},
      {"model=[1,2]", "config key 'model' must be a map, got a list (override 'model=[1,2]')"},
      {"model.lora_rank=${model}",
       "config interpolation cycle: model -> model (override 'model.lora_rank=${model}')"},
      {"x=${x}", "config interpolation cycle: x -> x (override 'x=${x}')"},
      {"output_dir=${oc.env:}",
       "'${oc.env:}' names no environment variable (override 'output_dir=${oc.env:}')"},
      {"optimizer=${optimizer}",
       "config interpolation cycle: optimizer -> optimizer (override 'optimizer=${optimizer}')"},
      {"dataset.source=${dataset}",
       "config interpolation cycle: dataset -> dataset (override 'dataset.source=${dataset}')"},
      {"a=---\nb", "unknown config key 'a' (override 'a=---\nb')"},
      {"a=\"unterminated", "override 'a=\"unterminated': the value is not valid YAML"},
      // Valid here: the file names are expanded (and checked) when the checkpoint is read.
      {"checkpointer.checkpoint_files={filename_format: '{}', max_filename: '-1'}", ""},
      {"model.lora_attn_modules=[[q_proj]]",
       "config key 'model.lora_attn_modules[0]' must be a string, got a list"},
      {"model.lora_attn_modules={a: 1}",
       "config key 'model.lora_attn_modules' must be a list, got a map"},
      {"~model", "missing required config key 'model'"},
      {"tokenizer=null",
       "missing required config key 'tokenizer' (text to token ids) (override "
       "'tokenizer=null')"},
      {"dataset._component_=[a]",
       "config key 'dataset._component_' must be a component name, got a list (override "
       "'dataset._component_=[a]')"},
      {"optimizer._component_={a: b}",
       "config key 'optimizer._component_' must be a component name, got a map (override "
       "'optimizer._component_={a: b}')"},
      // Valid: a string made of two references.
      {"metric_logger.log_dir=${output_dir}${output_dir}", ""},
      {"max_shard_size=1e400GB",
       "unknown config key 'max_shard_size' (override "
       "'max_shard_size=1e400GB')"},
      {"checkpointer.max_shard_size=1e400GB",
       "config key 'checkpointer.max_shard_size' must be a byte size (an integer, or text like "
       "\"5GB\"), got '1e400GB' (override 'checkpointer.max_shard_size=1e400GB')"},
      {"seed=99999999999999999999999",
       "config key 'seed' must be an integer, got '99999999999999999999999' (override "
       "'seed=99999999999999999999999')"}};
  for (const auto& [o, expected] : odd) {
    SCOPED_TRACE(o);
    const std::string msg = exercise(base, {o});
    if (expected.empty())
      EXPECT_EQ(msg, "");
    else
      EXPECT_TRUE(contains(msg, expected)) << msg;
  }
}
