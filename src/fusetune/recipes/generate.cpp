// generate: reads the model (and an optional adapter), renders the prompt with the chat
// template the datasets use, and runs the Generator. One prompt streams its answer token by
// token; a batch (prompt.user a list) prints each answer when all are done.
#include "fusetune/recipes/generate.h"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "fusetune/data/chat_format.h"
#include "fusetune/generation/generator.h"
#include "fusetune/recipes/inference_setup.h"
#include "fusetune/util/error.h"
#include "fusetune/util/fs.h"

namespace fusetune {
namespace {

struct Prompts {
  std::vector<std::string> text;  // for the record
  std::vector<std::vector<int32_t>> tokens;
  std::vector<int32_t> end_of_turn;
};

Prompts render_prompts(const Config& cfg, const Tokenizer& tok, const ModelConfig& model) {
  Prompts out;
  if (!cfg.is_map("prompt")) {  // plain text, continued as it is
    out.text.push_back(cfg.str("prompt"));
    out.tokens.push_back(tok.encode(out.text.back(), tok.default_add_bos(), false));
    return out;
  }
  const Config p = cfg.sub("prompt");
  const std::vector<std::string> users =
      p.is_list("user") ? p.str_list("user") : std::vector<std::string>{p.str("user")};
  FT_CHECK(!users.empty(), "config key 'prompt.user' is an empty list");
  auto format = make_chat_format(
      resolve_chat_format(cfg.str("template", "auto"), model.model_type, tok), tok);
  out.end_of_turn = format->end_of_turn_tokens();
  for (const std::string& user : users) {
    std::vector<Message> messages;
    if (p.has("system") && !p.str("system").empty())
      messages.push_back({Role::kSystem, p.str("system"), false});
    messages.push_back({Role::kUser, user, false});
    out.text.push_back(user);
    out.tokens.push_back(format->render_prompt(messages).tokens);
  }
  return out;
}

std::vector<int32_t> stop_tokens(const Config& cfg, const Tokenizer& tok, const ModelConfig& model,
                                 const Prompts& prompts) {
  std::vector<int32_t> ids = prompts.end_of_turn;
  if (tok.eos_id() >= 0) ids.push_back(tok.eos_id());
  for (int64_t id : model.eos_token_ids) ids.push_back(int32_t(id));
  for (const std::string& s : cfg.str_list("stop_tokens", {})) {
    auto id = tok.token_to_id(s);
    FT_CHECK(id.has_value(),
             "config key 'stop_tokens': '" + s + "' is not a token of the tokenizer");
    ids.push_back(*id);
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

// Prints a streamed answer as it grows: the text of all tokens so far, minus what is printed,
// held back while it ends in an incomplete UTF-8 character (decoded as U+FFFD).
class Streamer {
 public:
  explicit Streamer(const Tokenizer& tok) : tok_(tok) {}
  void add(int32_t id) {
    ids_.push_back(id);
    const std::string text = tok_.decode(ids_, /*skip_special_tokens=*/true);
    if (text.size() >= 3 && text.compare(text.size() - 3, 3, "\xEF\xBF\xBD") == 0) return;
    if (text.size() > printed_) {
      std::fwrite(text.data() + printed_, 1, text.size() - printed_, stdout);
      std::fflush(stdout);
      printed_ = text.size();
    }
  }

 private:
  const Tokenizer& tok_;
  std::vector<int32_t> ids_;
  size_t printed_ = 0;
};

double per_second(int64_t n, double s) { return s > 0 ? double(n) / s : 0.0; }

}  // namespace

int generate_recipe(const Config& cfg) {
  InferenceModel m = load_inference_model(cfg);
  auto tok = build_inference_tokenizer(cfg, m.model.config);
  const Prompts prompts = render_prompts(cfg, *tok, m.model.config);

  GenerationOptions o;
  o.max_new_tokens = cfg.i64("max_new_tokens", 300);
  o.sampling.temperature = cfg.f64("temperature", 0.6);
  o.sampling.top_k = cfg.has("top_k") ? cfg.i64("top_k") : 0;
  o.sampling.top_p = cfg.f64("top_p", 1.0);
  o.seed = uint64_t(cfg.i64("seed", 1234));
  o.use_kv_cache = cfg.boolean("enable_kv_cache", true);
  o.stop_tokens = stop_tokens(cfg, *tok, m.model.config, prompts);

  Generator gen(m.model.config, m.model.params, m.llama, m.mode, m.dtype);
  const bool stream = prompts.tokens.size() == 1;
  Streamer streamer(*tok);
  std::fprintf(stderr, "fusetune generate: %s, compile: %s, %zu prompt(s)\n", m.description.c_str(),
               cfg.str("compile", "true").c_str(), prompts.tokens.size());
  // A plain-text prompt is continued: print it, so that the output reads as one text.
  if (stream && !cfg.is_map("prompt")) std::fputs(prompts.text[0].c_str(), stdout);
  GenerationResult r = gen.generate(prompts.tokens, o, [&](int64_t, int32_t id) {
    if (stream) streamer.add(id);
  });
  std::vector<std::string> answers;
  for (size_t b = 0; b < r.tokens.size(); ++b) {
    answers.push_back(tok->decode(r.tokens[b], /*skip_special_tokens=*/true));
    if (!stream)
      std::printf("--- %zu: %s\n%s\n", b, prompts.text[b].c_str(), answers.back().c_str());
  }
  if (stream) std::printf("\n");
  std::fflush(stdout);
  const GenerationStats& s = r.stats;
  std::fprintf(
      stderr,
      "prefill: %lld tokens in %.3f s (%.1f tokens/s); decode: %lld tokens in %.3f s "
      "(%.1f tokens/s); KV cache %.2f MiB; compile %.2f s; finished: %s\n",
      (long long)s.prompt_tokens, s.prefill_seconds, per_second(s.prompt_tokens, s.prefill_seconds),
      (long long)s.decode_steps, s.decode_seconds,
      per_second(s.decode_steps * int64_t(r.tokens.size()), s.decode_seconds),
      double(s.kv_cache_bytes) / (1 << 20), s.compile_seconds, r.finish_reason.front().c_str());
  if (cfg.has("output_dir")) {
    nlohmann::json j;
    for (size_t b = 0; b < r.tokens.size(); ++b)
      j["generations"].push_back({{"prompt", prompts.text[b]},
                                  {"prompt_tokens", prompts.tokens[b]},
                                  {"tokens", r.tokens[b]},
                                  {"text", answers[b]},
                                  {"finish_reason", r.finish_reason[b]}});
    j["prefill_seconds"] = s.prefill_seconds;
    j["decode_seconds"] = s.decode_seconds;
    j["decode_steps"] = s.decode_steps;
    const std::filesystem::path dir = cfg.str("output_dir");
    std::filesystem::create_directories(dir);
    write_file_atomic(dir / "generations.json", j.dump(2) + "\n");
    std::fprintf(stderr, "wrote %s\n", (dir / "generations.json").c_str());
  }
  return 0;
}

}  // namespace fusetune
