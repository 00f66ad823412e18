#include "fusetune/dist/owned_gradients.h"

#include <cmath>

#include "fusetune/dist/sharded_optimizer.h"
#include "fusetune/optim/grad_clip.h"
#include "fusetune/util/error.h"

namespace fusetune::dist {

OwnedGradients::OwnedGradients(Communicator& comm, const std::vector<std::string>& names,
                               const std::vector<int64_t>& numels)
    : comm_(comm) {
  const std::vector<int> owner = partition_by_elements(numels, comm_.size());
  for (size_t i = 0; i < names.size(); ++i) owner_[names[i]] = owner[i];
}

bool OwnedGradients::reduce(const std::string& name, Tensor& grad, const std::string& what) {
  auto it = owner_.find(name);
  if (it == owner_.end()) return false;
  FT_CHECK(grad.dtype() == DType::F32,
           "zero_stage 2 and 3 sum fp32 gradients only; with dtype: bf16 use zero_stage 0 or 1");
  comm_.reduce_sum(grad.data<float>(), grad.numel(), it->second, what);
  return it->second == comm_.rank();
}

double OwnedGradients::global_norm(const std::vector<ParamRef>& refs, const std::string& what) {
  std::vector<double> squares(refs.size(), 0.0);
  for (size_t i = 0; i < refs.size(); ++i)
    if (mine(refs[i].name) && has_grad(refs[i])) squares[i] = grad_sum_squares({refs[i]});
  comm_.allreduce_sum(squares.data(), int64_t(squares.size()), what);
  double total = 0;
  for (double s : squares) total += s;  // grad_norm's order
  return std::sqrt(total);
}

}  // namespace fusetune::dist
