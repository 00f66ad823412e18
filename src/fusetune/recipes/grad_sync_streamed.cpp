// overlap_grad_allreduce (ZeRO-0/1, more than one rank, a step that hands over its gradients
// during the backward): the first step records the order the backward produces the gradients
// in and sums them after the backward; from the second on, the last micro-batch's gradients
// are summed in buckets while its backward goes on (distributed/grad_stream.h). The other
// micro-batches' gradients are held to the end of their run and accumulated as before.
#include <algorithm>
#include <set>

#include "fusetune/distributed/grad_allreduce.h"
#include "fusetune/distributed/grad_stream.h"
#include "fusetune/optim/grad_clip.h"
#include "fusetune/recipes/grad_sync.h"
#include "fusetune/util/error.h"

namespace fusetune {
namespace {

class Streamed final : public GradSync {
 public:
  explicit Streamed(GradSyncContext c)
      : c_(std::move(c)), trainable_set_(c_.trainable->begin(), c_.trainable->end()) {}

  // The hook: false when the step cannot hand its gradients over.
  bool install(TrainingStep& step) {
    return step.stream_gradients([this](const std::string& name, Tensor g) {
      if (!stream_now_) {
        if (!streamer_ && micro_k_ == 0 && trainable_set_.count(name)) arrival_.push_back(name);
        held_.emplace_back(name, std::move(g));
        return;
      }
      accumulate_gradient(*c_.grads, name, std::move(g), micro_k_ == 0);
      // The buckets sum every row over the ranks: the gradient is dense from here.
      c_.grads->at(name).drop_nonzero_rows();
      if (trainable_set_.count(name)) streamer_->add(name, c_.grads->at(name));
    });
  }

  void begin_step(TrainingStep&, const std::vector<Batch>&, const std::string& at_step) override {
    at_step_ = at_step;
    streaming_ = streamer_ != nullptr;
  }
  StepOutputs run_micro(TrainingStep& step, const Batch& b, double scale, int64_t global_step,
                        size_t k, size_t n) override {
    micro_k_ = int64_t(k);
    stream_now_ = streaming_ && k + 1 == n;
    if (stream_now_) streamer_->begin("the gradient all-reduce" + at_step_);
    StepOutputs out = step.run(b, scale, global_step, int64_t(k));
    if (!held_.empty()) {  // handed over during the run: accumulated here as before
      std::sort(held_.begin(), held_.end(),
                [](const auto& x, const auto& y) { return x.first < y.first; });
      for (auto& h : held_) out.grads.push_back(std::move(h));
      held_.clear();
    }
    return out;
  }
  void add(const std::string& name, Tensor grad, size_t k) override {
    accumulate_gradient(*c_.grads, name, std::move(grad), k == 0);
  }
  void end_micro_batches() override {
    stream_now_ = false;
    // The buckets' collectives come first on every rank (only that thread calls MPI until
    // then).
    if (streaming_) streamer_->finish();
  }
  void reduce() override {
    if (streaming_) return;
    std::vector<Tensor*> summed;
    for (const std::string& name : *c_.trainable)  // sorted: the same order on every rank
      if (auto it = c_.grads->find(name); it != c_.grads->end()) summed.push_back(&it->second);
    dist::allreduce_gradients(*c_.comm, summed, "the gradient all-reduce" + at_step_,
                              c_.bucket_elements);
    start_streaming(summed.size());
  }
  double norm(const std::vector<ParamRef>& refs, std::optional<double> clip) override {
    return clip ? clip_grad_norm(refs, *clip) : fusetune::grad_norm(refs);
  }
  // The step's own collectives and its waits for the buckets'.
  std::optional<double> comm_wait_seconds(double comm_s) override {
    if (!streaming_) return std::nullopt;
    return comm_s - streamer_->take_collective_seconds() + streamer_->take_wait_seconds();
  }

 private:
  // The first step's arrival order on rank 0 becomes every rank's bucket layout.
  void start_streaming(size_t summed) {
    FT_CHECK(arrival_.size() == summed, "overlap_grad_allreduce: the backward handed over " +
                                            std::to_string(arrival_.size()) + " of " +
                                            std::to_string(summed) + " gradients");
    std::vector<std::string> names =
        rank0_order(c_, arrival_, "the gradient bucket layout broadcast");
    std::vector<int64_t> numels;
    std::vector<DType> dtypes;
    for (const std::string& name : names) {
      FT_CHECK(c_.grads->count(name),
               "overlap_grad_allreduce: rank 0's gradients differ from "
               "this rank's ('" +
                   name + "')");
      const Tensor& g = c_.grads->at(name);
      numels.push_back(g.numel());
      dtypes.push_back(g.dtype());
    }
    streamer_ = std::make_unique<dist::GradientStreamer>(*c_.comm, names, numels, dtypes,
                                                         c_.bucket_elements);
    c_.log("overlap_grad_allreduce: from step 2 the gradients are summed in " +
           std::to_string(streamer_->jobs()) +
           " collectives while the last micro-batch's backward runs");
  }

  GradSyncContext c_;
  const std::set<std::string> trainable_set_;
  std::unique_ptr<dist::GradientStreamer> streamer_;
  std::vector<std::string> arrival_;  // the first backward's trainable gradients, in order
  std::vector<std::pair<std::string, Tensor>> held_;
  bool streaming_ = false;   // this step's last backward streams
  bool stream_now_ = false;  // the backward running now streams
  int64_t micro_k_ = 0;
  std::string at_step_;
};

}  // namespace

std::unique_ptr<GradSync> make_streamed(const GradSyncContext& c, TrainingStep& step) {
  auto s = std::make_unique<Streamed>(c);
  if (!s->install(step)) return nullptr;
  return s;
}

}  // namespace fusetune
