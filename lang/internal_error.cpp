#include "lang/internal_error.h"

#include <fmt/format.h>

namespace piper {

void internal_error(const char* file, int line, const std::string& what) {
  throw InternalError(fmt::format(
      "internal error in Piper (a bug in Piper, not in your strategy) at {}:{}: {}\n"
      "please report it with the model manifest and strategy that triggered it",
      file, line, what));
}

}  // namespace piper
