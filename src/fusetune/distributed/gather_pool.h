#pragma once
// ZeRO-3's buffers for gathered parameters (distributed/sharded_params.h), kept for reuse. A
// gathered parameter lives only around its uses, so without reuse each broadcast lands in a fresh
// buffer; buffers of 1 MiB and more are fresh mappings then (the CLI sets glibc's mmap
// threshold to 1 MiB) and the receive page-faults all of them: 225 MB of the mid shape's
// parameters broadcast between 2 ranks took 0.27-0.6 s into fresh buffers and 0.035 s into
// reused ones on this machine.
//
// A tensor taken here hands its buffer back when its last reference drops; the buffer then
// waits, still allocated and counted (core/memory.h), for the next take of the same byte
// size. So the pool holds, per byte size, the most buffers of that size ever live at once:
// compile/memory_estimate.h plans exactly that.
#include <cstdint>
#include <memory>

#include "fusetune/core/tensor.h"

namespace fusetune::dist {

class GatherPool {
 public:
  GatherPool();
  ~GatherPool();  // frees the idle buffers; a lent one is freed when its tensor goes
  GatherPool(const GatherPool&) = delete;
  GatherPool& operator=(const GatherPool&) = delete;
  // An uninitialized tensor over an idle buffer of its byte size, or a new one.
  Tensor take(const Shape& shape, DType dtype);
  // Frees the idle buffers (a checkpoint gathers the whole model to rank 0: none held then).
  void trim();
  int64_t held_bytes() const;  // idle and lent
  // Buffers allocated since the last call (0 while every take finds an idle buffer).
  int64_t take_new_buffers();

 private:
  struct State;
  std::shared_ptr<State> state_;  // shared with the lent buffers, which may outlive the pool
};

}  // namespace fusetune::dist
