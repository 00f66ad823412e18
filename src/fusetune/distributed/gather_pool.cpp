#include "fusetune/distributed/gather_pool.h"

#include <map>
#include <mutex>
#include <utility>

#include "fusetune/core/memory.h"

namespace fusetune::dist {

struct GatherPool::State {
  std::mutex mu;
  std::multimap<size_t, void*> idle;  // by byte size
  int64_t held = 0;
  int64_t new_buffers = 0;
  ~State() {
    for (const auto& [bytes, p] : idle) memory::release(p, bytes);
  }
};

GatherPool::GatherPool() : state_(std::make_shared<State>()) {}

GatherPool::~GatherPool() { trim(); }

Tensor GatherPool::take(const Shape& shape, DType dtype) {
  const size_t bytes = size_t(shape_numel(shape)) * dtype_size(dtype);
  if (bytes == 0) return Tensor::empty(shape, dtype);
  void* p = nullptr;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    if (auto it = state_->idle.find(bytes); it != state_->idle.end()) {
      p = it->second;
      state_->idle.erase(it);
    }
  }
  if (!p) {
    p = memory::allocate(bytes);
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->held += int64_t(bytes);
    ++state_->new_buffers;
  }
  // The owner hands the buffer back when the tensor's storage dies.
  std::shared_ptr<const void> owner(p, [s = state_, bytes](const void* q) {
    std::lock_guard<std::mutex> lock(s->mu);
    s->idle.emplace(bytes, const_cast<void*>(q));
  });
  return Tensor::borrow(p, shape, dtype, std::move(owner));
}

void GatherPool::trim() {
  std::multimap<size_t, void*> idle;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    idle.swap(state_->idle);
    for (const auto& [bytes, p] : idle) state_->held -= int64_t(bytes);
  }
  for (const auto& [bytes, p] : idle) memory::release(p, bytes);
}

int64_t GatherPool::held_bytes() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->held;
}

int64_t GatherPool::take_new_buffers() {
  std::lock_guard<std::mutex> lock(state_->mu);
  return std::exchange(state_->new_buffers, 0);
}

}  // namespace fusetune::dist
