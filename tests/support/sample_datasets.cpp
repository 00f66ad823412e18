#include "sample_datasets.h"

#include <utility>
#include <vector>

namespace fusetune::testing {

SampleDataset numbered_dataset(int n) {
  std::vector<Sample> v;
  for (int i = 0; i < n; ++i) v.push_back({{i, i}, {i, i}, {}});
  DatasetReport r;
  r.name = "numbered";
  return SampleDataset(std::move(v), r);
}

}  // namespace fusetune::testing
