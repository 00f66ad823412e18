#pragma once
// Data parallelism's gradient sum overlapped with the backward (ZeRO-0/1). The backward hands
// over each finished gradient (OnOutput, runtime/executor.h); the gradients are laid out once in
// flat fp32 buckets in the order the backward produced them on rank 0 (the same layout on every
// rank), and as soon as a bucket's gradients have all arrived it is packed and handed to a
// communication thread, which all-reduces it and writes the sums back while the backward goes
// on; finish() waits for the last one. The sums are allreduce_gradients' (fp32 buckets, bf16
// summed in fp32 and rounded once, large fp32 gradients in place), so with 2 ranks (a + b) the
// gradients are bitwise the same.
// MPI: between begin() and finish() only the communication thread calls it, one collective at a
// time, in bucket order on every rank; the caller makes no collective in between (MPI is
// initialized with MPI_THREAD_MULTIPLE all the same: communicator.cpp says why). Each collective
// runs under the communicator's watchdog as before. Memory: at most two buckets at once (one being
// packed, one being summed), allocated at the first packed bucket of a step and freed by finish()
// (stream_buffer_elements).
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "fusetune/core/tensor.h"
#include "fusetune/distributed/communicator.h"
#include "fusetune/distributed/grad_allreduce.h"

namespace fusetune::dist {

class GradientStreamer {
 public:
  // The gradients by name in the order the backward produces them (rank 0's: the same on every
  // rank), with their element counts and dtypes (F32 or BF16).
  GradientStreamer(Communicator& comm, std::vector<std::string> names, std::vector<int64_t> numels,
                   std::vector<DType> dtypes, int64_t bucket_elements = kBucketElements);
  ~GradientStreamer();
  GradientStreamer(const GradientStreamer&) = delete;
  GradientStreamer& operator=(const GradientStreamer&) = delete;

  bool has(const std::string& name) const { return index_.count(name) > 0; }
  // Starts a step; `what` names its collectives ("the gradient all-reduce of step 7").
  void begin(const std::string& what);
  // `grad` is the step's final gradient of `name`: nothing may write it until finish(), which
  // leaves the sum over the ranks in it.
  void add(const std::string& name, const Tensor& grad);
  // Packs what is left, waits for every bucket and frees the bucket space; rethrows what the
  // communication thread threw.
  void finish();
  // Buckets (collectives of any kind) per step.
  size_t jobs() const { return jobs_.size(); }
  // Seconds the caller waited for the communication thread (a free bucket, the last
  // collectives) since the last call: the part of the collectives the backward did not hide.
  double take_wait_seconds() { return std::exchange(wait_s_, 0.0); }
  // Seconds the communication thread spent in collectives since the last call (counted in the
  // communicator's take_comm_seconds() too). Call after finish().
  double take_collective_seconds() { return std::exchange(collective_s_, 0.0); }

 private:
  enum class Kind { Bucket, InPlace, Pieces };
  struct Job {
    Kind kind;
    std::vector<size_t> members;  // indices into names_
    int64_t elements = 0;
  };
  struct Queued {
    size_t job;
    int buffer;  // -1: none
  };
  void launch_ready();
  int acquire_buffer();
  void communicate();
  void run_job(const Job& job, float* buffer);

  Communicator& comm_;
  int64_t bucket_elements_;
  std::vector<std::string> names_;
  std::vector<int64_t> numels_;
  std::vector<DType> dtypes_;
  std::unordered_map<std::string, size_t> index_;
  std::vector<Job> jobs_;
  std::vector<size_t> job_of_;   // per gradient
  int64_t buffer_elements_ = 0;  // per buffer
  int buffer_count_ = 0;         // 1 or 2
  std::vector<Tensor> grads_;    // this step's, per gradient
  std::vector<size_t> missing_;  // per job: gradients not added yet
  size_t next_job_ = 0;          // the first job not handed over yet (compute thread)
  bool active_ = false;
  double wait_s_ = 0;

  // Shared with the communication thread.
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Tensor> buffers_;
  std::vector<bool> buffer_free_;
  std::deque<Queued> queue_;
  size_t done_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
  double collective_s_ = 0;
  std::string what_;
  std::thread thread_;
};

// The fp32 elements of the bucket space GradientStreamer holds at once for gradients of these
// element counts and dtypes: allreduce_buffer_elements' space, twice when a step has more than
// one collective that needs it (with one, nothing can overlap it).
int64_t stream_buffer_elements(const std::vector<int64_t>& numels, const std::vector<DType>& dtypes,
                               int64_t bucket_elements = kBucketElements);

}  // namespace fusetune::dist
