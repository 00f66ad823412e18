#pragma once
// Activation checkpointing (enable_activation_checkpointing: true): each decoder layer keeps
// only its input for the backward; every other forward value the backward reads is
// recomputed by a copy of the layer's forward emitted just before the layer's backward.
// Saved activations drop from O(layers x layer size) to O(layers x hidden) + one layer.
#include "fusetune/compile/pass.h"

namespace fusetune::passes::activation_checkpointing {
std::string run(Graph& g, const PassOptions& opts);
}
