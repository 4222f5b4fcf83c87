// Internal errors: bugs in Piper, reported as such and never blamed on the user's strategy.
#pragma once
#include <stdexcept>
#include <string>

namespace piper {

class InternalError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

[[noreturn]] void internal_error(const char* file, int line, const std::string& what);

}  // namespace piper

#define PIPER_INTERNAL_ASSERT(cond, msg)                                       \
  do {                                                                         \
    if (!(cond)) ::piper::internal_error(__FILE__, __LINE__, std::string(#cond ": ") + (msg)); \
  } while (0)
