#include "fusetune/graph/op.h"

#include "fusetune/graph/op_desc.h"

namespace fusetune {

const char* op_name(Op op) { return op < Op::kCount ? op_desc(op).name : "?"; }

}  // namespace fusetune
