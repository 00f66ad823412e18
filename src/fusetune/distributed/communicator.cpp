#include "fusetune/distributed/communicator.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "fusetune/util/error.h"

namespace fusetune::dist {
namespace {

bool env_set(const char* name) {
  const char* v = std::getenv(name);
  return v && *v;
}

void check(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw Error(std::string(call) + " failed: " + std::string(text, len));
}

// Reductions go in pieces of 512 KiB. Open MPI's reductions allocate a temporary buffer the
// size of the message on every call, and main() sets glibc's mmap threshold to 1 MiB, so a
// larger message gets a fresh mapping per call and page-faults all of it: a 240 MB fp32
// all-reduce between 2 ranks ran at 0.26 GB/s in one call or 8 MiB pieces and at 3.3 GB/s in
// 512 KiB pieces on this machine (MPI_Reduce alike; MPI_Bcast needs no temporary).
constexpr int64_t kReducePieceBytes = int64_t(1) << 19;

// A floating-point sum over 3 or more ranks whose bits do not depend on the message: every
// element is ((x0 + x1) + x2) + ... in rank order. MPI_Allreduce's bits do: Open MPI picks its
// algorithm by message size, and its ring adds an element's terms starting at a rank that
// depends on the element's offset, so a gradient reduced alone (ZeRO-2, 3) and the same gradient
// packed into a bucket (ZeRO-0, 1) summed to different last bits (3 ranks: ZeRO-2's weights
// left ZeRO-0's after one step). Each rank takes chunk `rank` of every rank's buffer
// (MPI_Alltoallv), adds the parts in rank order, and the sums go back to all
// (MPI_Allgatherv): a ring all-reduce's traffic. Two ranks keep MPI_Allreduce: x0 + x1 and
// x1 + x0 are the same bits.
template <typename T>
void sum_in_rank_order(T* data, int count, MPI_Datatype type, int rank, int size) {
  const size_t ranks = static_cast<size_t>(size);
  std::vector<int> counts(ranks), displs(ranks);
  for (int k = 0; k < size; ++k) {
    displs[size_t(k)] = int(int64_t(count) * k / size);
    counts[size_t(k)] = int(int64_t(count) * (k + 1) / size) - displs[size_t(k)];
  }
  const int mine = counts[size_t(rank)];
  std::vector<T> parts(static_cast<size_t>(mine) * ranks);
  std::vector<int> part_counts(ranks, mine), part_displs(ranks);
  for (int k = 0; k < size; ++k) part_displs[size_t(k)] = k * mine;
  check(MPI_Alltoallv(data, counts.data(), displs.data(), type, parts.data(), part_counts.data(),
                      part_displs.data(), type, MPI_COMM_WORLD),
        "MPI_Alltoallv");
  T* sum = data + displs[size_t(rank)];
  std::copy_n(parts.data(), mine, sum);
  for (int k = 1; k < size; ++k) {
    const T* part = parts.data() + size_t(k) * size_t(mine);
    for (int i = 0; i < mine; ++i) sum[i] += part[i];
  }
  check(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data, counts.data(), displs.data(), type,
                       MPI_COMM_WORLD),
        "MPI_Allgatherv");
}

template <typename T>
void allreduce(T* data, int64_t n, MPI_Datatype type, int rank, int size) {
  constexpr int64_t kMax = kReducePieceBytes / int64_t(sizeof(T));
  for (int64_t at = 0; at < n; at += kMax) {
    const int count = int(std::min(kMax, n - at));
    if (std::is_floating_point_v<T> && size > 2)
      sum_in_rank_order(data + at, count, type, rank, size);
    else
      check(MPI_Allreduce(MPI_IN_PLACE, data + at, count, type, MPI_SUM, MPI_COMM_WORLD),
            "MPI_Allreduce");
  }
}

// Arms the watchdog and adds the time spent to a counter.
class CollectiveScope {
 public:
  CollectiveScope(Watchdog* w, const std::string& what, double* seconds)
      : guard_(w, what), seconds_(seconds), t0_(std::chrono::steady_clock::now()) {}
  ~CollectiveScope() {
    *seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }
  CollectiveScope(const CollectiveScope&) = delete;
  CollectiveScope& operator=(const CollectiveScope&) = delete;

 private:
  WatchdogScope guard_;
  double* seconds_;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace

bool launched_by_mpi() {
  // Open MPI's mpirun, PMIx launchers (srun --mpi=pmix, prterun), MPICH's Hydra, and srun
  // without an MPI plugin (SLURM_STEP_NUM_TASKS is set only inside a job step).
  return env_set("OMPI_COMM_WORLD_SIZE") || env_set("PMIX_RANK") || env_set("PMI_RANK") ||
         (env_set("SLURM_STEP_NUM_TASKS") && env_set("SLURM_PROCID"));
}

Communicator::Communicator(int rank, int size, bool mpi, double timeout_s, bool serialized)
    : rank_(rank), size_(size), mpi_(mpi), serialized_(serialized) {
  if (mpi_) watchdog_ = std::make_unique<Watchdog>(timeout_s, who());
}

std::unique_ptr<Communicator> Communicator::from_environment(double timeout_s, bool threads) {
  FT_CHECK(timeout_s > 0, "dist_timeout_seconds must be > 0");
  if (!launched_by_mpi())
    return std::unique_ptr<Communicator>(new Communicator(0, 1, false, 0, true));
  int initialized = 0;
  MPI_Initialized(&initialized);
  FT_CHECK(!initialized, "MPI is already initialized in this process");
  int provided = 0;
  // The gradient streamer's communication thread calls MPI while the main thread runs the
  // backward (distributed/grad_stream.h; never both at once). MPI_THREAD_SERIALIZED would allow
  // that, but with it Open MPI 4.1 hung here in an all-reduce of the streamer within a few ZeRO-1
  // steps (2 of 3 runs of the mid shape; likely its unlocked internals touched from the computing
  // thread, e.g. by its memory hooks on free): MPI_THREAD_MULTIPLE turns its locking on, and
  // has not hung since. Without the streamer only the main thread calls MPI (the watchdog
  // never does).
  check(MPI_Init_thread(nullptr, nullptr, threads ? MPI_THREAD_MULTIPLE : MPI_THREAD_FUNNELED,
                        &provided),
        "MPI_Init_thread");
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return std::unique_ptr<Communicator>(
      new Communicator(rank, size, true, timeout_s, provided >= MPI_THREAD_MULTIPLE));
}

Communicator::~Communicator() {
  watchdog_.reset();
  if (mpi_) MPI_Finalize();
}

std::string Communicator::who() const {
  return "rank " + std::to_string(rank_) + " of " + std::to_string(size_);
}

void Communicator::allreduce_sum(float* data, int64_t n, const std::string& what) {
  if (size_ == 1) return;
  CollectiveScope w(watchdog_.get(), what, &comm_s_);
  allreduce(data, n, MPI_FLOAT, rank_, size_);
}

void Communicator::allreduce_sum(double* data, int64_t n, const std::string& what) {
  if (size_ == 1) return;
  CollectiveScope w(watchdog_.get(), what, &comm_s_);
  allreduce(data, n, MPI_DOUBLE, rank_, size_);
}

void Communicator::allreduce_sum(int64_t* data, int64_t n, const std::string& what) {
  if (size_ == 1) return;
  CollectiveScope w(watchdog_.get(), what, &comm_s_);
  allreduce(data, n, MPI_INT64_T, rank_, size_);
}

// An all-reduce, not MPI_Reduce: Open MPI 4.1's default MPI_Reduce algorithm moved 0.2 GB/s
// between 2 ranks on this machine where its all-reduce moved 3.2 GB/s (and every reduce
// algorithm forced by MCA parameter 2.5-5.3 GB/s), so the sum to one rank costs less done
// everywhere. The other ranks' buffers end with the sum too; the callers drop them.
void Communicator::reduce_sum(float* data, int64_t n, int root, const std::string& what) {
  if (size_ == 1) return;
  FT_CHECK(root >= 0 && root < size_, "reduce_sum: root " + std::to_string(root) + " out of range");
  CollectiveScope w(watchdog_.get(), what, &comm_s_);
  allreduce(data, n, MPI_FLOAT, rank_, size_);
}

void Communicator::barrier(const std::string& what) {
  if (size_ == 1) return;
  CollectiveScope w(watchdog_.get(), what, &comm_s_);
  check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
}

namespace {

// Byte buffers in pieces of at most 1 GiB (MPI counts are int).
template <typename F>
void in_pieces(int64_t bytes, F f) {
  constexpr int64_t kMax = int64_t(1) << 30;
  for (int64_t at = 0; at < bytes; at += kMax) f(at, int(std::min(kMax, bytes - at)));
}

}  // namespace

void Communicator::broadcast(void* data, int64_t bytes, int root, const std::string& what) {
  if (size_ == 1) return;
  CollectiveScope w(watchdog_.get(), what, &comm_s_);
  in_pieces(bytes, [&](int64_t at, int n) {
    check(MPI_Bcast(static_cast<char*>(data) + at, n, MPI_BYTE, root, MPI_COMM_WORLD), "MPI_Bcast");
  });
}

void Communicator::send(const void* data, int64_t bytes, int dest, const std::string& what) {
  CollectiveScope w(watchdog_.get(), what, &comm_s_);
  in_pieces(bytes, [&](int64_t at, int n) {
    check(MPI_Send(static_cast<const char*>(data) + at, n, MPI_BYTE, dest, 0, MPI_COMM_WORLD),
          "MPI_Send");
  });
}

void Communicator::recv(void* data, int64_t bytes, int source, const std::string& what) {
  CollectiveScope w(watchdog_.get(), what, &comm_s_);
  in_pieces(bytes, [&](int64_t at, int n) {
    check(MPI_Recv(static_cast<char*>(data) + at, n, MPI_BYTE, source, 0, MPI_COMM_WORLD,
                   MPI_STATUS_IGNORE),
          "MPI_Recv");
  });
}

double Communicator::take_comm_seconds() { return std::exchange(comm_s_, 0.0); }

void Communicator::abort(int code) {
  if (mpi_) MPI_Abort(MPI_COMM_WORLD, code);
  std::exit(code);
}

}  // namespace fusetune::dist
