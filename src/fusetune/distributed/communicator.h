#pragma once
// The ranks of a distributed run (MPI_COMM_WORLD) and the collectives the training loop needs.
// A run not started by a launcher (mpirun, srun) is a single rank and never touches MPI, so
// a distributed recipe started plainly is simply single-process.
//
// Every collective runs under a watchdog (watchdog.h): a rank that waits longer than
// dist_timeout_seconds for the others reports it and exits.
#include <cstdint>
#include <memory>
#include <string>

#include "fusetune/distributed/watchdog.h"

namespace fusetune::dist {

// True when this process was started by an MPI launcher (mpirun/mpiexec, srun).
bool launched_by_mpi();

class Communicator {
 public:
  // MPI_COMM_WORLD when launched_by_mpi() (MPI is initialized here and finalized by the
  // destructor), else one rank without MPI.
  // `threads`: initialize MPI with MPI_THREAD_MULTIPLE, so that a second thread may run
  // collectives (distributed/grad_stream.h); else MPI_THREAD_FUNNELED (only the main thread).
  static std::unique_ptr<Communicator> from_environment(double timeout_s, bool threads = false);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // True when another thread may call the collectives while this one does not (MPI initialized
  // with MPI_THREAD_MULTIPLE: see the .cpp; always with one rank).
  bool serialized_threads() const { return serialized_; }
  // "rank 1 of 2": how messages name this process.
  std::string who() const;

  // Element-wise sums over the ranks, in place; `what` names the wait in a timeout message.
  void allreduce_sum(float* data, int64_t n, const std::string& what);
  void allreduce_sum(double* data, int64_t n, const std::string& what);
  void allreduce_sum(int64_t* data, int64_t n, const std::string& what);
  // The element-wise sum over the ranks into `root`'s buffer (the others' buffers are
  // overwritten too: see the .cpp).
  void reduce_sum(float* data, int64_t n, int root, const std::string& what);
  void barrier(const std::string& what);
  // Raw bytes: `root`'s buffer copied to every rank; point to point (ZeRO state gathering).
  void broadcast(void* data, int64_t bytes, int root, const std::string& what);
  void send(const void* data, int64_t bytes, int dest, const std::string& what);
  void recv(void* data, int64_t bytes, int source, const std::string& what);
  // Ends every rank at once (MPI_Abort): after an error on this rank, the others must not wait
  // for it until the timeout.
  [[noreturn]] void abort(int code);
  // Seconds spent in collectives (waiting for the other ranks included) since the last call.
  double take_comm_seconds();

 private:
  Communicator(int rank, int size, bool mpi, double timeout_s, bool serialized);
  int rank_ = 0;
  int size_ = 1;
  bool mpi_ = false;
  bool serialized_ = true;
  std::unique_ptr<Watchdog> watchdog_;  // only with MPI
  double comm_s_ = 0;
};

}  // namespace fusetune::dist
