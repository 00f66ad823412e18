#pragma once
// How much memory this process may still allocate: the smaller of the kernel's estimate for the
// machine (/proc/meminfo MemAvailable) and the room left under the process's memory cgroup
// (v2 memory.max, v1 memory.limit_in_bytes, of its cgroup and every parent), so that a run
// can be refused before it is killed by the OOM killer.
#include <cstdint>
#include <optional>
#include <string>

namespace fusetune {

// The environment variable that replaces the measurement (a byte count), for tests and for
// users who know better: FUSETUNE_AVAILABLE_MEMORY_BYTES=8000000000.
inline constexpr const char* kAvailableMemoryEnv = "FUSETUNE_AVAILABLE_MEMORY_BYTES";

struct AvailableMemory {
  int64_t bytes = 0;
  std::string source;  // "MemAvailable", "cgroup memory.max", or the environment variable
};

// nullopt when nothing could be read (not Linux, /proc not mounted). A cgroup's room is its
// limit minus its usage without the reclaimable page cache (inactive_file), as the kernel
// counts it when deciding to reclaim rather than kill.
std::optional<AvailableMemory> available_memory();

// The parsing, separated for tests: `meminfo` is /proc/meminfo's text; nullopt without a
// MemAvailable line.
std::optional<int64_t> parse_mem_available(const std::string& meminfo);

}  // namespace fusetune
