// libFuzzer target: arbitrary bytes as a JSONL dataset file, read by every dataset kind
// (text_completion, alpaca, instruct, chat, preference) with the byte tokenizer, with
// on_bad_row skip and error. Any input must give a dataset or throw fusetune::Error naming
// the file; a dataset's samples must have labels as long as their tokens.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>

#include "fusetune/data/dataset_factory.h"
#include "fusetune/data/datasets/preference.h"
#include "fusetune/tokenizers/load_tokenizer.h"
#include "fusetune/util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace fusetune;
  static const std::unique_ptr<Tokenizer> tok = load_tokenizer("byte", {});
  static const std::string path =
      "/tmp/fusetune_jsonl_fuzz_" + std::to_string(::getpid()) + ".jsonl";
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(data), std::streamsize(size));
  for (const char* kind : {"text_completion", "alpaca", "instruct", "chat", "preference"})
    for (const char* bad : {"skip", "error"}) {
      DatasetOptions o;
      o.kind = kind;
      o.source = path;
      o.on_bad_row = bad;
      o.max_seq_len = 64;
      o.column = o.kind == "chat" ? "conversations" : o.kind == "text_completion" ? "text" : "";
      if (o.kind == "chat") o.conversation_style = "openai";
      try {
        if (o.kind == "preference") {
          auto ds = build_preference_dataset(o, *tok);
          for (int64_t i = 0; i < ds->size(); ++i)
            if (ds->get(i).chosen.labels.size() != ds->get(i).chosen.tokens.size()) std::abort();
        } else {
          auto ds = build_dataset(o, *tok);
          for (int64_t i = 0; i < ds->size(); ++i)
            if (ds->get(i).labels.size() != ds->get(i).tokens.size()) std::abort();
        }
      } catch (const Error&) {
      }
    }
  return 0;
}
