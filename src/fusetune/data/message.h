#pragma once
// A conversation turn, the common form every prompt-style dataset converts its rows into
// before a chat format turns them into tokens (torchtune's Message).
#include <string>
#include <string_view>
#include <vector>

namespace fusetune {

enum class Role { kSystem, kUser, kAssistant, kTool };

struct Message {
  Role role = Role::kUser;
  std::string content;
  bool trained = false;  // its content (and end-of-turn token) become targets
};

std::string_view role_name(Role r);  // "system", "user", "assistant", "ipython"

// Prepends `system_prompt` as a system message, replacing the conversation's own system
// messages (torchtune's new_system_prompt). Empty prompt: messages unchanged.
void apply_system_prompt(std::vector<Message>& messages, const std::string& system_prompt,
                         bool train_on_input);

}  // namespace fusetune
