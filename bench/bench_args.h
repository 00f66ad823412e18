#pragma once
// Command-line options of the benchmarks: `--name value` pairs, each name one the benchmark
// declares with its default; `--threads N` (always accepted) sets OpenMP's thread count.
#include <omp.h>

#include <map>
#include <string>
#include <vector>

#include "fusetune/util/error.h"
#include "fusetune/util/strings.h"

namespace fusetune::bench {

class BenchArgs {
 public:
  // defaults: option name (without "--") -> default value.
  BenchArgs(int argc, char** argv, std::map<std::string, std::string> defaults)
      : values_(std::move(defaults)) {
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      FT_CHECK(a.rfind("--", 0) == 0 && i + 1 < argc,
               "expected --name value, got '" + a + "' (" + known() + ")");
      const std::string name = a.substr(2), value = argv[++i];
      if (name == "threads") {
        omp_set_num_threads(std::stoi(value));
        continue;
      }
      FT_CHECK(values_.count(name), "unknown argument '" + a + "' (" + known() + ")");
      values_[name] = value;
    }
  }
  const std::string& str(const std::string& name) const { return values_.at(name); }
  int64_t i64(const std::string& name) const { return std::stoll(str(name)); }
  std::vector<std::string> list(const std::string& name) const { return split(str(name), ','); }

 private:
  std::string known() const {
    std::string s = "options: --threads";
    for (const auto& [k, v] : values_) s += ", --" + k + " (default " + v + ")";
    return s;
  }
  std::map<std::string, std::string> values_;
};

}  // namespace fusetune::bench
