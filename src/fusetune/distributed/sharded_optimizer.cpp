#include "fusetune/distributed/sharded_optimizer.h"

#include <algorithm>
#include <cstring>
#include <set>

#include "fusetune/util/error.h"

namespace fusetune::dist {
namespace {

// NamedTensors as bytes: per entry [u64 name length][name][i32 dtype][i32 rank][i64 dims...]
// [data].
template <typename T>
void put(std::vector<char>& b, const T& v) {
  const char* p = reinterpret_cast<const char*>(&v);
  b.insert(b.end(), p, p + sizeof(T));
}

std::vector<char> serialize(const NamedTensors& entries) {
  std::vector<char> b;
  for (const auto& [name, t] : entries) {
    put(b, uint64_t(name.size()));
    b.insert(b.end(), name.begin(), name.end());
    put(b, int32_t(t.dtype()));
    put(b, int32_t(t.shape().size()));
    for (int64_t d : t.shape()) put(b, int64_t(d));
    const char* data = static_cast<const char*>(t.raw());
    b.insert(b.end(), data, data + t.nbytes());
  }
  return b;
}

NamedTensors deserialize(const std::vector<char>& b) {
  NamedTensors out;
  size_t at = 0;
  auto get = [&](auto& v) {
    FT_CHECK(at + sizeof(v) <= b.size(), "ZeRO state gather: truncated message");
    std::memcpy(&v, b.data() + at, sizeof(v));
    at += sizeof(v);
  };
  while (at < b.size()) {
    uint64_t len = 0;
    get(len);
    FT_CHECK(at + len <= b.size(), "ZeRO state gather: truncated message");
    std::string name(b.data() + at, len);
    at += len;
    int32_t dtype = 0, ndim = 0;
    get(dtype);
    get(ndim);
    Shape shape(size_t(ndim), 0);
    for (auto& d : shape) {
      int64_t v = 0;
      get(v);
      d = v;
    }
    Tensor t = Tensor::empty(shape, DType(dtype));
    FT_CHECK(at + t.nbytes() <= b.size(), "ZeRO state gather: truncated message");
    std::memcpy(t.raw(), b.data() + at, t.nbytes());
    at += t.nbytes();
    out.emplace_back(std::move(name), std::move(t));
  }
  return out;
}

}  // namespace

std::vector<int> partition_by_elements(const std::vector<int64_t>& numels, int ranks) {
  int64_t total = 0;
  for (int64_t n : numels) total += n;
  std::vector<int> owner(numels.size(), 0);
  int64_t before = 0;
  for (size_t i = 0; i < numels.size(); ++i) {
    // The rank whose equal share holds this tensor's middle element.
    const int64_t middle = before + numels[i] / 2;
    owner[i] = total > 0 ? int(std::min<int64_t>(ranks - 1, middle * ranks / total)) : 0;
    before += numels[i];
  }
  return owner;
}

ShardedOptimizer::ShardedOptimizer(std::unique_ptr<Optimizer> inner, Communicator& comm,
                                   const std::vector<std::string>& names,
                                   const std::vector<int64_t>& numels, bool broadcast_updates)
    : inner_(std::move(inner)), comm_(comm), broadcast_updates_(broadcast_updates) {
  const std::vector<int> owner = partition_by_elements(numels, comm_.size());
  for (size_t i = 0; i < names.size(); ++i) owner_[names[i]] = owner[i];
}

int ShardedOptimizer::owner(const ParamRef& p) const {
  auto it = owner_.find(p.name);
  FT_CHECK(it != owner_.end(), "ZeRO: '" + p.name + "' is not a trainable parameter");
  return it->second;
}

std::vector<ParamRef> ShardedOptimizer::owned(const std::vector<ParamRef>& params) {
  std::vector<ParamRef> mine;
  for (const ParamRef& p : params)
    if (owner(p) == comm_.rank()) mine.push_back(p);
  return mine;
}

int64_t broadcast_buffer_bytes(const std::vector<int64_t>& nbytes, int ranks) {
  if (ranks <= 1) return 0;
  int64_t small = 0;
  for (int64_t n : nbytes)
    if (n < kBroadcastBucketBytes) small += n;
  // Packed a bucket at a time; allocated as fp32 elements.
  return (std::min(small, kBroadcastBucketBytes) + 3) / 4 * 4;
}

void ShardedOptimizer::step(const std::vector<ParamRef>& params, double lr) {
  gathered_.clear();
  inner_->step(owned(params), lr);
  if (comm_.size() == 1 || !broadcast_updates_) return;
  // Every parameter from the rank that updated it, in name order (the same sequence of
  // broadcasts on every rank): a large one in place, small ones packed into one counted
  // staging bucket.
  std::vector<int64_t> nbytes;
  std::vector<int> owner_of;  // the owners fixed at construction
  for (const ParamRef& p : params) {
    nbytes.push_back(int64_t(p.value->nbytes()));
    owner_of.push_back(owner(p));
  }
  const int64_t space = broadcast_buffer_bytes(nbytes, comm_.size());
  Tensor staging = space > 0 ? Tensor::empty({space / 4}, DType::F32) : Tensor();
  char* bucket = space > 0 ? static_cast<char*>(staging.raw()) : nullptr;
  int64_t used = 0;
  int root = -1;
  std::vector<const ParamRef*> pending;  // packed in `bucket`, in order, all from `root`
  auto what = [](int r) {
    return "the parameter broadcast (ZeRO-1) from rank " + std::to_string(r);
  };
  auto flush = [&]() {
    if (pending.empty()) return;
    int64_t at = 0;
    if (root == comm_.rank())
      for (const ParamRef* p : pending) {
        std::memcpy(bucket + at, p->value->raw(), p->value->nbytes());
        at += int64_t(p->value->nbytes());
      }
    comm_.broadcast(bucket, used, root, what(root));
    at = 0;
    if (root != comm_.rank())
      for (const ParamRef* p : pending) {
        std::memcpy(p->value->raw(), bucket + at, p->value->nbytes());
        at += int64_t(p->value->nbytes());
      }
    pending.clear();
    used = 0;
  };
  for (size_t i = 0; i < params.size(); ++i) {
    if (nbytes[i] >= kBroadcastBucketBytes) {
      comm_.broadcast(params[i].value->raw(), nbytes[i], owner_of[i], what(owner_of[i]));
      continue;
    }
    if (owner_of[i] != root || used + nbytes[i] > space) flush();
    root = owner_of[i];
    pending.push_back(&params[i]);
    used += nbytes[i];
  }
  flush();
}

void ShardedOptimizer::save_state(NamedTensors& out) const {
  NamedTensors all;
  inner_->save_state(all);
  for (const auto& e : gathered_) all.push_back(e);
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& e : all) out.push_back(std::move(e));
}

void ShardedOptimizer::load_state(const StateMap& state, const std::vector<ParamRef>& params) {
  std::set<std::string> all, mine;
  for (const ParamRef& p : params) all.insert(p.name);
  const std::vector<ParamRef> own = owned(params);
  for (const ParamRef& p : own) mine.insert(p.name);
  // Entries are "<param>.<what>": keep this rank's, drop the other ranks' (unknown parameters
  // stay, for the inner optimizer to report).
  StateMap kept;
  for (const auto& [key, t] : state) {
    const size_t dot = key.rfind('.');
    const std::string param = dot == std::string::npos ? key : key.substr(0, dot);
    if (mine.count(param) || !all.count(param)) kept.emplace(key, t);
  }
  inner_->load_state(kept, own);
}

void ShardedOptimizer::gather_state(const std::string& what) {
  gathered_.clear();
  if (comm_.size() == 1) return;
  if (comm_.rank() == 0) {
    for (int r = 1; r < comm_.size(); ++r) {
      int64_t bytes = 0;
      comm_.recv(&bytes, sizeof bytes, r, what);
      std::vector<char> blob(size_t(bytes), 0);
      comm_.recv(blob.data(), bytes, r, what);
      for (auto& e : deserialize(blob)) gathered_.push_back(std::move(e));
    }
  } else {
    NamedTensors mine;
    inner_->save_state(mine);
    const std::vector<char> blob = serialize(mine);
    const int64_t bytes = int64_t(blob.size());
    comm_.send(&bytes, sizeof bytes, 0, what);
    comm_.send(blob.data(), bytes, 0, what);
  }
}

}  // namespace fusetune::dist
