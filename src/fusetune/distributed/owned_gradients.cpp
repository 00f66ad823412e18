#include "fusetune/distributed/owned_gradients.h"

#include <cmath>

#include "fusetune/distributed/sharded_optimizer.h"
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

void OwnedGradients::set_order(std::vector<std::string> order) {
  for (const std::string& name : order)
    FT_CHECK(owner_.count(name), "ZeRO-2: '" + name + "' in the gradient order is not trained");
  order_ = std::move(order);
  next_ = 0;
}

void OwnedGradients::hand_over(const std::string& name, Tensor grad, const Keep& keep,
                               const std::string& what) {
  if (!owner_.count(name)) return;
  FT_CHECK(next_ < order_.size() && !held_.count(name),
           "ZeRO-2: the backward handed over the gradient of '" + name +
               "' twice, or one rank 0's backward does not produce");
  held_[name] = std::move(grad);
  while (next_ < order_.size()) {
    auto it = held_.find(order_[next_]);
    if (it == held_.end()) return;  // its turn: wait for it
    const std::string& turn = order_[next_++];
    Tensor g = std::move(it->second);
    held_.erase(it);
    if (reduce(turn, g, what)) keep(turn, std::move(g));
  }
}

void OwnedGradients::end_of_backward() {
  FT_CHECK(next_ == order_.size(),
           "ZeRO-2: this rank's backward did not produce the gradient of '" +
               (next_ < order_.size() ? order_[next_] : std::string()) + "' that rank 0's does");
  FT_CHECK(held_.empty(), "ZeRO-2: this rank's backward produced the gradient of '" +
                              (held_.empty() ? std::string() : held_.begin()->first) +
                              "' that rank 0's does not");
  next_ = 0;
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
