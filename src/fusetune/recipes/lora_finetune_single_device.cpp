// Placeholder: the recipe is written on its own branch and replaces this file at merge.
#include "fusetune/recipes/lora_finetune_single_device.h"

#include "fusetune/util/error.h"

namespace fusetune {

int lora_finetune_single_device(const Config&) {
  throw Error("recipe lora_finetune_single_device is not implemented yet");
}

}  // namespace fusetune
