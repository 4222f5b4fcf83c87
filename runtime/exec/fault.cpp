#include "runtime/exec/fault.h"

#include <fmt/format.h>

#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

namespace piper::runtime {

std::optional<Fault> parse_fault(const char* spec) {
  if (!spec || !*spec) return std::nullopt;
  Fault f;
  std::vector<std::string> parts;
  std::string cur;
  for (const char* c = spec;; ++c) {
    if (*c == ':' || *c == 0) {
      parts.push_back(cur);
      cur.clear();
      if (*c == 0) break;
    } else {
      cur += *c;
    }
  }
  const auto number = [](const std::string& t) {
    return !t.empty() && t.find_first_not_of("0123456789") == std::string::npos && t.size() < 10;
  };
  if (parts.size() != 4 || !number(parts[0]) || !number(parts[1]) ||
      (parts[3] != "fail" && parts[3] != "stall" && parts[3] != "drop"))
    throw std::runtime_error(fmt::format("PIPER_FAULT='{}': expected RANK:STEP:TOKEN:fail|stall|drop", spec));
  f.rank = std::stoi(parts[0]);
  f.step = std::stoll(parts[1]);
  f.token = parts[2];
  f.kind = parts[3];
  return f;
}

bool Fault::act(bool is_send) const {
  if (kind == "fail") throw std::runtime_error("injected fault (PIPER_FAULT)");
  if (kind == "stall")
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));  // until the watchdog ends the job
  return kind == "drop" && is_send;  // the peer never gets it
}

}  // namespace piper::runtime
