#pragma once
// Memory accounting. Every tensor buffer is allocated here, so the counters cover parameters,
// gradients, optimizer state and activations alike: `peak` is what torchtune reports as
// peak_memory_alloc (the high-water mark of live allocated bytes since the last reset).
#include <cstddef>
#include <cstdint>

namespace fusetune::memory {

void* allocate(size_t bytes);  // 64-byte aligned, counted; throws fusetune::Error on failure
void release(void* ptr, size_t bytes);

int64_t current_bytes();
int64_t peak_bytes();
void reset_peak();  // peak := current

}  // namespace fusetune::memory
