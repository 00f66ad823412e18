#include "fusetune/optim/param_ref.h"

#include <set>

#include "fusetune/util/error.h"

namespace fusetune {

void check_params(const std::vector<ParamRef>& params, const char* who) {
  std::set<std::string> seen;
  for (const ParamRef& p : params) {
    const std::string at = std::string(who) + ": parameter '" + p.name + "'";
    FT_CHECK(!p.name.empty(), std::string(who) + ": a parameter has an empty name");
    FT_CHECK(seen.insert(p.name).second, at + " is passed twice");
    FT_CHECK(p.value != nullptr && p.value->defined(), at + " has no value tensor");
    const DType dt = p.value->dtype();
    FT_CHECK(dt == DType::F32 || dt == DType::F64 || dt == DType::BF16,
             at + " is " + dtype_name(dt) + "; only F32, F64 and BF16 parameters can be trained");
    if (!has_grad(p)) continue;
    FT_CHECK(p.grad->dtype() == dt, at + " has a " + dtype_name(p.grad->dtype()) +
                                        " gradient for a " + dtype_name(dt) + " value");
    FT_CHECK(p.grad->shape() == p.value->shape(), at + " has gradient shape " +
                                                      shape_str(p.grad->shape()) + ", expected " +
                                                      shape_str(p.value->shape()));
  }
}

}  // namespace fusetune
