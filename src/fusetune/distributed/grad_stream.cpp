#include "fusetune/distributed/grad_stream.h"

#include <algorithm>

#include "fusetune/util/error.h"

namespace fusetune::dist {
namespace {

// Adds the seconds of a scope to a counter.
class Timed {
 public:
  explicit Timed(double* seconds) : seconds_(seconds), t0_(std::chrono::steady_clock::now()) {}
  ~Timed() {
    *seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }
  Timed(const Timed&) = delete;
  Timed& operator=(const Timed&) = delete;

 private:
  double* seconds_;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace

int64_t stream_buffer_elements(const std::vector<int64_t>& numels, const std::vector<DType>& dtypes,
                               int64_t bucket_elements) {
  int64_t small = 0, large_bf16 = 0;
  for (size_t i = 0; i < numels.size(); ++i) {
    if (numels[i] < bucket_elements)
      small += numels[i];
    else if (dtypes[i] != DType::F32)
      ++large_bf16;
  }
  // Packed in any order, the small gradients fill one bucket exactly when they fit in one.
  const int64_t users = (small > bucket_elements ? 2 : small > 0 ? 1 : 0) + large_bf16;
  return allreduce_buffer_elements(numels, dtypes, bucket_elements) * (users >= 2 ? 2 : 1);
}

GradientStreamer::GradientStreamer(Communicator& comm, std::vector<std::string> names,
                                   std::vector<int64_t> numels, std::vector<DType> dtypes,
                                   int64_t bucket_elements)
    : comm_(comm),
      bucket_elements_(bucket_elements),
      names_(std::move(names)),
      numels_(std::move(numels)),
      dtypes_(std::move(dtypes)) {
  FT_CHECK(names_.size() == numels_.size() && names_.size() == dtypes_.size(),
           "GradientStreamer: names, numels and dtypes differ in length");
  // The layout: allreduce_gradients' buckets, filled in arrival order. A large gradient is a
  // collective of its own and leaves the open bucket open.
  job_of_.resize(names_.size());
  int open = -1;
  int users = 0;
  for (size_t i = 0; i < names_.size(); ++i) {
    FT_CHECK(dtypes_[i] == DType::F32 || dtypes_[i] == DType::BF16,
             "gradient all-reduce: unsupported gradient dtype");
    FT_CHECK(index_.emplace(names_[i], i).second, "GradientStreamer: '" + names_[i] + "' twice");
    const int64_t n = numels_[i];
    if (n >= bucket_elements_) {
      const bool f32 = dtypes_[i] == DType::F32;
      jobs_.push_back({f32 ? Kind::InPlace : Kind::Pieces, {i}, n});
      users += f32 ? 0 : 1;
      job_of_[i] = jobs_.size() - 1;
      continue;
    }
    if (open >= 0 && jobs_[size_t(open)].elements + n > bucket_elements_) open = -1;
    if (open < 0) {
      jobs_.push_back({Kind::Bucket, {}, 0});
      open = int(jobs_.size()) - 1;
      ++users;
    }
    jobs_[size_t(open)].members.push_back(i);
    jobs_[size_t(open)].elements += n;
    job_of_[i] = size_t(open);
  }
  buffer_count_ = std::min(users, 2);
  const int64_t total = stream_buffer_elements(numels_, dtypes_, bucket_elements_);
  buffer_elements_ = buffer_count_ > 0 ? total / buffer_count_ : 0;
  buffers_.resize(size_t(buffer_count_));
  buffer_free_.assign(size_t(buffer_count_), true);
  thread_ = std::thread([this] { communicate(); });
}

GradientStreamer::~GradientStreamer() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    queue_.clear();  // after an error: what has not started never will (the run ends)
  }
  cv_.notify_all();
  thread_.join();  // an all-reduce under way finishes (or its watchdog ends the process)
}

void GradientStreamer::begin(const std::string& what) {
  FT_CHECK(!active_, "GradientStreamer: begin() twice");
  {
    std::lock_guard<std::mutex> lock(mu_);
    what_ = what;
    done_ = 0;
  }
  grads_.assign(names_.size(), Tensor());
  missing_.assign(jobs_.size(), 0);
  for (size_t j = 0; j < jobs_.size(); ++j) missing_[j] = jobs_[j].members.size();
  next_job_ = 0;
  active_ = true;
}

void GradientStreamer::add(const std::string& name, const Tensor& grad) {
  FT_CHECK(active_, "GradientStreamer: add() outside a step");
  auto it = index_.find(name);
  FT_CHECK(it != index_.end(),
           "gradient all-reduce: '" + name + "' was not among the gradients of the first step");
  const size_t i = it->second;
  FT_CHECK(!grads_[i].defined(), "gradient all-reduce: '" + name + "' handed over twice");
  FT_CHECK(grad.numel() == numels_[i] && grad.dtype() == dtypes_[i],
           "gradient all-reduce: '" + name + "' changed its size or dtype");
  grads_[i] = grad;
  --missing_[job_of_[i]];
  launch_ready();
}

int GradientStreamer::acquire_buffer() {
  const Timed timed(&wait_s_);
  std::unique_lock<std::mutex> lock(mu_);
  // A busy buffer belongs to a job already queued: the communication thread frees it.
  cv_.wait(lock, [&] {
    return error_ ||
           std::find(buffer_free_.begin(), buffer_free_.end(), true) != buffer_free_.end();
  });
  if (error_) std::rethrow_exception(error_);
  const int b =
      int(std::find(buffer_free_.begin(), buffer_free_.end(), true) - buffer_free_.begin());
  buffer_free_[size_t(b)] = false;
  if (!buffers_[size_t(b)].defined())
    buffers_[size_t(b)] = Tensor::empty({buffer_elements_}, DType::F32);
  return b;
}

// Hands over the jobs whose gradients have all arrived, in layout order (the order every rank
// runs the collectives in, whatever order this rank's gradients arrive in).
void GradientStreamer::launch_ready() {
  while (next_job_ < jobs_.size() && missing_[next_job_] == 0) {
    const Job& job = jobs_[next_job_];
    int b = -1;
    if (job.kind != Kind::InPlace) b = acquire_buffer();
    if (job.kind == Kind::Bucket) {
      float* bucket = buffers_[size_t(b)].data<float>();
      int64_t at = 0;
      for (size_t i : job.members) {
        gradient_to_f32(grads_[i], 0, numels_[i], bucket + at);
        at += numels_[i];
      }
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back({next_job_, b});
    }
    cv_.notify_all();
    ++next_job_;
  }
}

void GradientStreamer::finish() {
  FT_CHECK(active_, "GradientStreamer: finish() outside a step");
  active_ = false;
  for (size_t j = next_job_; j < jobs_.size(); ++j)
    for (size_t i : jobs_[j].members)
      FT_CHECK(grads_[i].defined(), "gradient all-reduce: the backward produced no gradient for '" +
                                        names_[i] + "' (the first step did)");
  launch_ready();
  const Timed timed(&wait_s_);
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return error_ || done_ == jobs_.size(); });
  if (error_) std::rethrow_exception(error_);
  for (Tensor& b : buffers_) b = Tensor();
  grads_.clear();
}

void GradientStreamer::run_job(const Job& job, float* buffer) {
  switch (job.kind) {
    case Kind::InPlace:
      comm_.allreduce_sum(grads_[job.members[0]].data<float>(), job.elements, what_);
      break;
    case Kind::Bucket: {
      comm_.allreduce_sum(buffer, job.elements, what_);
      int64_t at = 0;
      for (size_t i : job.members) {
        gradient_from_f32(buffer + at, 0, numels_[i], grads_[i]);
        at += numels_[i];
      }
      break;
    }
    case Kind::Pieces:
      allreduce_in_pieces(comm_, grads_[job.members[0]], buffer, buffer_elements_, what_);
      break;
  }
}

void GradientStreamer::communicate() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (stop_) return;
    const Queued q = queue_.front();
    queue_.pop_front();
    float* buffer = q.buffer >= 0 ? buffers_[size_t(q.buffer)].data<float>() : nullptr;
    const bool failed = error_ != nullptr;
    lock.unlock();
    std::exception_ptr error;
    double seconds = 0;
    if (!failed) {  // after a failure no other collective starts (the run ends)
      try {
        const Timed timed(&seconds);
        run_job(jobs_[q.job], buffer);
      } catch (...) {
        error = std::current_exception();
      }
    }
    lock.lock();
    if (q.buffer >= 0) buffer_free_[size_t(q.buffer)] = true;
    ++done_;
    collective_s_ += seconds;
    if (error && !error_) error_ = error;
    cv_.notify_all();
  }
}

}  // namespace fusetune::dist
