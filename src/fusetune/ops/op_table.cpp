// The op table: every op's description (graph/op_desc.h), gathered from its family's file and
// checked at compile time to cover each Op exactly once (docs/design.md §1).
#include <array>
#include <span>

#include "fusetune/graph/op_desc.h"
#include "fusetune/ops/attention.h"
#include "fusetune/ops/data_movement.h"
#include "fusetune/ops/distillation.h"
#include "fusetune/ops/elementwise.h"
#include "fusetune/ops/leaves.h"
#include "fusetune/ops/losses.h"
#include "fusetune/ops/matmul.h"
#include "fusetune/ops/norms.h"

namespace fusetune {
namespace {

constexpr size_t kOpCount = size_t(Op::kCount);

constexpr std::span<const OpDesc* const> kFamilies[] = {
    ops::kLeavesOps,    ops::kMatmulOps, ops::kElementwiseOps,  ops::kNormsOps,
    ops::kAttentionOps, ops::kLossesOps, ops::kDataMovementOps, ops::kDistillationOps,
};

constexpr bool described_once(size_t op) {
  int entries = 0;
  for (const auto& family : kFamilies)
    for (const OpDesc* d : family) entries += size_t(d->op) == op;
  return entries == 1;
}

constexpr bool every_op_described_once() {
  for (size_t op = 0; op < kOpCount; ++op)
    if (!described_once(op)) return false;
  return true;
}

static_assert(every_op_described_once(),
              "each Op in graph/op.h needs exactly one OpDesc, listed in its family's ops in "
              "src/fusetune/ops/");

constexpr std::array<const OpDesc*, kOpCount> make_table() {
  std::array<const OpDesc*, kOpCount> table{};
  for (const auto& family : kFamilies)
    for (const OpDesc* d : family) table[size_t(d->op)] = d;
  return table;
}

constexpr std::array<const OpDesc*, kOpCount> kTable = make_table();

}  // namespace

const OpDesc& op_desc(Op op) { return *kTable[size_t(op)]; }

}  // namespace fusetune
