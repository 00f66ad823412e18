#include "fusetune/util/system_memory.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "fusetune/util/error.h"
#include "fusetune/util/strings.h"

namespace fusetune {
namespace {

namespace fs = std::filesystem;

std::optional<std::string> slurp(const fs::path& p) {
  std::ifstream in(p);
  if (!in) return std::nullopt;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A byte count as cgroup files write it; nullopt for "max", an unset v1 limit (a huge
// page-rounded number) or anything unreadable.
std::optional<int64_t> limit_value(const std::optional<std::string>& text) {
  if (!text) return std::nullopt;
  const std::string t = trim(*text);
  if (t.empty() || t == "max") return std::nullopt;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(t.c_str(), &end, 10);
  if (end == t.c_str() || v >= (1ULL << 62)) return std::nullopt;
  return int64_t(v);
}

// `key value` lines (memory.stat).
int64_t stat_value(const std::optional<std::string>& text, const std::string& key) {
  if (!text) return 0;
  std::istringstream in(*text);
  std::string k;
  long long v = 0;
  while (in >> k >> v)
    if (k == key) return int64_t(v);
  return 0;
}

// The room left in one cgroup directory, if it has a limit.
std::optional<int64_t> cgroup_room(const fs::path& dir, bool v2) {
  const auto limit = limit_value(slurp(dir / (v2 ? "memory.max" : "memory.limit_in_bytes")));
  if (!limit) return std::nullopt;
  const auto usage = limit_value(slurp(dir / (v2 ? "memory.current" : "memory.usage_in_bytes")));
  const auto stat = slurp(dir / "memory.stat");
  const int64_t reclaimable = stat_value(stat, v2 ? "inactive_file" : "total_inactive_file");
  const int64_t used = std::max<int64_t>(0, usage.value_or(0) - reclaimable);
  return std::max<int64_t>(0, *limit - used);
}

// The smallest room over the process's cgroup and its parents (v2 unified, else v1 memory).
std::optional<int64_t> cgroup_available() {
  const auto self = slurp("/proc/self/cgroup");
  if (!self) return std::nullopt;
  std::optional<int64_t> best;
  std::istringstream lines(*self);
  for (std::string line; std::getline(lines, line);) {
    // "0::/path" (v2) or "4:memory:/path" (v1).
    const size_t a = line.find(':');
    const size_t b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1);
    const std::string path = line.substr(b + 1);
    const bool v2 = line.compare(0, a, "0") == 0 && controllers.empty();
    bool memory = false;
    for (const std::string& c : split(controllers, ','))
      if (c == "memory") memory = true;
    if (!v2 && !memory) continue;
    const fs::path root = v2 ? fs::path("/sys/fs/cgroup") : fs::path("/sys/fs/cgroup/memory");
    // From the process's cgroup up to the mount root (inside a cgroup namespace the path may
    // not exist below the root: then only the root is read).
    fs::path rel = fs::path(path).relative_path();
    for (;;) {
      std::error_code ec;
      const fs::path dir = root / rel;
      if (fs::is_directory(dir, ec))
        if (auto room = cgroup_room(dir, v2)) best = best ? std::min(*best, *room) : *room;
      if (rel.empty()) break;
      rel = rel.parent_path();
    }
  }
  return best;
}

}  // namespace

std::optional<int64_t> parse_mem_available(const std::string& meminfo) {
  std::istringstream in(meminfo);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("MemAvailable:", 0) != 0) continue;
    std::istringstream f(line.substr(13));
    long long kb = 0;
    std::string unit;
    if (!(f >> kb)) return std::nullopt;
    f >> unit;
    return int64_t(kb) * (unit == "kB" || unit.empty() ? 1024 : 1);
  }
  return std::nullopt;
}

std::optional<AvailableMemory> available_memory() {
  if (const char* env = std::getenv(kAvailableMemoryEnv); env && *env) {
    char* end = nullptr;
    const long long v = std::strtoll(env, &end, 10);
    FT_CHECK(end != env && *end == '\0' && v >= 0,
             std::string(kAvailableMemoryEnv) + " must be a byte count, got '" + env + "'");
    return AvailableMemory{int64_t(v), kAvailableMemoryEnv};
  }
  std::optional<AvailableMemory> out;
  if (const auto meminfo = slurp("/proc/meminfo"))
    if (const auto v = parse_mem_available(*meminfo)) out = AvailableMemory{*v, "MemAvailable"};
  if (const auto cg = cgroup_available(); cg && (!out || *cg < out->bytes))
    out = AvailableMemory{*cg, "the memory cgroup's limit"};
  return out;
}

}  // namespace fusetune
