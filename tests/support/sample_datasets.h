#pragma once
// Small in-memory datasets for the data loader tests.
#include "fusetune/data/dataset.h"

namespace fusetune::testing {

// `n` samples; sample i has tokens and labels {i, i}. Named "numbered".
SampleDataset numbered_dataset(int n);

}  // namespace fusetune::testing
