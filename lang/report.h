// The human summary piper-check prints for a valid strategy: mesh, stages, directives at a glance.
#pragma once
#include <string>

#include "lang/manifest.h"
#include "lang/strategy.h"

namespace piper {

std::string strategy_report(const CheckedStrategy& s, const Manifest& m);

}  // namespace piper
