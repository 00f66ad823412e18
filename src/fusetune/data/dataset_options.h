#pragma once
// Everything that selects and shapes a dataset, as a plain struct. The recipe fills it from
// the `dataset:` section of the YAML config (keys keep torchtune's names); build_dataset()
// validates it.
#include <cstdint>
#include <map>
#include <optional>
#include <string>

namespace fusetune {

struct DatasetOptions {
  // text_completion | pretokenized | alpaca | instruct | chat | gsm8k (see dataset_factory.h).
  std::string kind = "text_completion";
  std::string source;  // path of a .json (array or JSON lines), .jsonl or .txt file
  // text_completion: the text column (default "text"); chat: the conversation column
  // (default "messages" for openai, "conversations" for sharegpt). Empty = default.
  std::string column;
  // Expected column name -> the name in the file, e.g. {output: response} (torchtune's).
  std::map<std::string, std::string> column_map;
  std::string split = "train";  // "train", "train[:90%]", "train[90%:]", "train[10:200]"
  bool train_on_input = false;  // prompt tokens become targets too
  int64_t max_seq_len = 0;      // samples are cut to this many tokens; 0 = no limit
  bool packed = false;          // pack samples into rows of exactly max_seq_len tokens
  // Packed only: let a sample continue in the next row instead of starting a new row when it
  // does not fit. Default: true for text_completion/pretokenized, false for prompt datasets.
  std::optional<bool> split_across_pack;
  std::string template_name = "auto";  // config key `template`: llama3|chatml|llama2|mistral|plain
  std::string model_family;            // picks the template when it is auto, e.g. "llama3"
  std::string conversation_style = "auto";  // chat: openai | sharegpt | auto (by the columns)
  std::string new_system_prompt;            // replaces the rows' system messages when set
  std::string on_bad_row = "error";         // error | skip (skipped rows are counted)
  bool add_eos = true;                      // text_completion: EOS after each document
  // gsm8k (datasets/prompts.h): torchtune's partition key and the prompt around {question}
  // (empty: the default reasoning prompt).
  std::string partition;
  std::string prompt_template;
};

}  // namespace fusetune
