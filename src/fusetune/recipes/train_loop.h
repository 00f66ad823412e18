#pragma once
// The training script shared by the single-device recipes. A recipe says what it trains
// (which parameters, and any change to the model); the loop is the same: load, build the
// joint step graph, compile it as `compile` says, iterate, log, checkpoint, resume.
#include <functional>
#include <string>

#include "fusetune/config/config.h"
#include "fusetune/models/llama.h"

namespace fusetune {

struct TrainJob {
  std::string recipe;
  TrainablePredicate trainable;
};

int run_training(const Config& cfg, const TrainJob& job);

}  // namespace fusetune
