// A parameter's search domain (`param mb = 8 in {1, 2, 4, 8};`): the values piper-tune tries.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "lang/ast.h"

namespace piper {

// What a domain evaluates to, or where and why it cannot be.
struct DomainValues {
  std::vector<int64_t> values;  // in the order written (booleans as 0 and 1)
  bool boolean = false;         // the values are true/false
  std::string error;            // "" when valid
  SourceLoc error_loc;
};

// Evaluates a domain for a world of `world` ranks. A domain's expressions are constants: literals,
// `world`, and arithmetic on them (it is read by piper-tune before any other name has a value).
// `divisors(N)` is every divisor of N, ascending.
DomainValues eval_domain(const ast::ParamDomain& d, int64_t world);

}  // namespace piper
