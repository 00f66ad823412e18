#include "fusetune/recipes/training_step.h"

#include <algorithm>
#include <chrono>

#include "fusetune/compile/memory_plan.h"
#include "fusetune/util/error.h"

namespace fusetune {
namespace {

Tensor ids_tensor(const std::vector<int32_t>& v, int64_t rows, int64_t T) {
  Tensor t = Tensor::empty({rows, T}, DType::I32);
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return t;
}

}  // namespace

const CompiledGraphs::Entry& CompiledGraphs::entry(const Batch& b, double* compile_s) {
  const auto key = std::make_tuple(b.batch_size, b.seq_len, !b.doc_ids.empty());
  auto it = entries_.find(key);
  if (it == entries_.end()) {
    const auto t0 = std::chrono::steady_clock::now();
    Graph g = build_(b.batch_size, b.seq_len, !b.doc_ids.empty());
    Entry e;
    for (const auto& [name, v] : g.outputs()) e.output_names.push_back(name);
    e.step = compile_graph(g, passes_, arena_);
    e.early = early_update_outputs(e.step.executor->graph());
    *compile_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    it = entries_.emplace(key, std::move(e)).first;
  }
  return it->second;
}

std::vector<std::string> CompiledGraphs::gradient_order(const Batch& b, double* compile_s) {
  const Entry& e = entry(b, compile_s);
  const auto& outputs = e.step.executor->graph().outputs();
  // run_nodes hands an early output over right after its node, a node's outputs in output
  // order; run() the rest after the graph.
  std::vector<std::pair<int, size_t>> early;  // (node, output index)
  std::vector<std::string> order;
  for (size_t k = 0; k < outputs.size(); ++k)
    if (e.early[k]) early.push_back({int(outputs[k].second.node), k});
  std::sort(early.begin(), early.end());
  for (const auto& [node, k] : early) order.push_back(e.output_names[k].substr(5));
  for (size_t k = 0; k < outputs.size(); ++k)
    if (!e.early[k] && e.output_names[k].rfind("grad:", 0) == 0)
      order.push_back(e.output_names[k].substr(5));
  return order;
}

TensorMap CompiledGraphs::run(const Batch& b, const TensorMap& inputs, const ParamSource& params,
                              double* compile_s, const GradientHook& gradients) {
  const Entry& e = entry(b, compile_s);
  OnOutput on_output;
  if (gradients)
    on_output = [&](size_t k, const Tensor& t) {
      if (!e.early[k]) return false;
      gradients(e.output_names[k].substr(5), t);
      return true;
    };
  std::vector<Tensor> out = e.step.executor->run(inputs, params, on_output);
  TensorMap named;
  for (size_t i = 0; i < out.size(); ++i) {
    const std::string& name = e.output_names[i];
    if (!gradients || name.rfind("grad:", 0) != 0)
      named[name] = std::move(out[i]);
    else if (!e.early[i])
      gradients(name.substr(5), std::move(out[i]));
  }
  return named;
}

double TrainingStep::evaluate(const Batch&) {
  throw Error("this recipe has no validation (dataset_val)");
}

TensorMap batch_inputs(const Batch& b) {
  TensorMap m;
  m["tokens"] = ids_tensor(b.tokens, b.batch_size, b.seq_len);
  m["labels"] = ids_tensor(b.labels, b.batch_size, b.seq_len);
  m["positions"] = ids_tensor(b.positions, b.batch_size, b.seq_len);
  if (!b.doc_ids.empty()) m["doc_ids"] = ids_tensor(b.doc_ids, b.batch_size, b.seq_len);
  return m;
}

Tensor scalar_input(double value, DType dtype) {
  Tensor s = Tensor::empty({}, dtype);
  if (dtype == DType::F64)
    s.data<double>()[0] = value;
  else
    s.data<float>()[0] = float(value);
  return s;
}

std::vector<std::pair<std::string, Tensor>> gradients_of(const TensorMap& outputs) {
  std::vector<std::pair<std::string, Tensor>> grads;
  for (const auto& [name, t] : outputs)
    if (name.rfind("grad:", 0) == 0) grads.push_back({name.substr(5), t});
  std::sort(grads.begin(), grads.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  return grads;
}

}  // namespace fusetune
