#include "fusetune/data/message.h"

#include <algorithm>

namespace fusetune {

std::string_view role_name(Role r) {
  switch (r) {
    case Role::kSystem:
      return "system";
    case Role::kUser:
      return "user";
    case Role::kAssistant:
      return "assistant";
    case Role::kTool:
      return "ipython";  // Llama 3's name for tool output
  }
  return "user";
}

void apply_system_prompt(std::vector<Message>& messages, const std::string& system_prompt,
                         bool train_on_input) {
  if (system_prompt.empty()) return;
  std::erase_if(messages, [](const Message& m) { return m.role == Role::kSystem; });
  messages.insert(messages.begin(), Message{Role::kSystem, system_prompt, train_on_input});
}

}  // namespace fusetune
