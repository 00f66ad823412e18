#include "fusetune/data/datasets/instruct.h"

#include "fusetune/data/chat_format.h"
#include "fusetune/data/datasets/common.h"
#include "fusetune/util/error.h"

namespace fusetune::datasets {

std::string alpaca_prompt(const std::string& instruction, const std::string& input) {
  if (input.empty())
    return "Below is an instruction that describes a task. Write a response that appropriately "
           "completes the request.\n\n### Instruction:\n" +
           instruction + "\n\n### Response:\n";
  return "Below is an instruction that describes a task, paired with an input that provides "
         "further context. Write a response that appropriately completes the request.\n\n"
         "### Instruction:\n" +
         instruction + "\n\n### Input:\n" + input + "\n\n### Response:\n";
}

std::unique_ptr<SampleDataset> load_instruct(const DatasetOptions& opts, const Tokenizer& tok) {
  const bool alpaca = opts.kind == "alpaca";
  check_column_map(opts, {"instruction", "input", "output"}, opts.kind);
  const std::string instruction_col = mapped(opts, "instruction"),
                    input_col = mapped(opts, "input"), output_col = mapped(opts, "output");
  auto format =
      make_chat_format(resolve_chat_format(opts.template_name, opts.model_family, tok), tok);

  auto convert = [&](const nlohmann::json& row) {
    std::string prompt;
    const nlohmann::json* instruction = optional_column(row, instruction_col);
    if (alpaca || instruction) {
      std::string input;
      // A missing or null input means "no input", as in the Alpaca data itself.
      if (const nlohmann::json* in = optional_column(row, input_col); in && !in->is_null()) {
        FT_CHECK(in->is_string(),
                 "column '" + input_col + "' is " + json_kind(*in) + ", expected a string");
        input = in->get<std::string>();
      }
      prompt = alpaca_prompt(string_column(row, instruction_col), input);
    } else {
      prompt = string_column(row, input_col);
    }
    std::vector<Message> messages = {{Role::kUser, prompt, opts.train_on_input},
                                     {Role::kAssistant, string_column(row, output_col), true}};
    apply_system_prompt(messages, opts.new_system_prompt, opts.train_on_input);
    return format->render(messages);
  };
  return build_samples(read_records(opts, /*allow_text=*/false), opts, truncation_for(opts),
                       convert);
}

}  // namespace fusetune::datasets
