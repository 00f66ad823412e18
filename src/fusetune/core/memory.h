#pragma once
// Memory accounting. Every tensor buffer is allocated here, so the counters cover parameters,
// gradients, optimizer state and activations alike: `peak` is what torchtune reports as
// peak_memory_alloc (the high-water mark of live allocated bytes since the last reset).
#include <cstddef>
#include <cstdint>
#include <memory>

namespace fusetune::memory {

void* allocate(size_t bytes);  // 64-byte aligned, counted; throws fusetune::Error on failure
void release(void* ptr, size_t bytes);

// The same with a note on what a freed buffer holds: `release` keeps `note` with the buffer
// while it is kept for reuse, and `allocate` with `note` prefers a kept buffer that has one and
// hands its note back (null: the contents are unknown). core/tensor.h's row sets use it.
using Note = std::shared_ptr<const void>;
void* allocate(size_t bytes, Note* note);
void release(void* ptr, size_t bytes, Note note);

int64_t current_bytes();
int64_t peak_bytes();
void reset_peak();  // peak := current

// Freed buffers of 2 MiB or more are kept for reuse by the next allocation of the same size
// (their pages stay resident: no page faults, no kernel zeroing), as long as the live bytes plus
// the kept ones stay within 9/8 of the largest live total the process has had. Not counted as
// live.
// FUSETUNE_MEMORY_CACHE=0 turns it off.
int64_t cached_bytes();
int64_t lifetime_peak_bytes();  // the largest live total so far (never reset)
void release_cached();          // frees every kept buffer

}  // namespace fusetune::memory
