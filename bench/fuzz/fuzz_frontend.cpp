// libFuzzer target: any bytes as a strategy, parsed and checked against the example GPT and MoE
// manifests. The front end must report errors, never crash, hang or leak (ASan + UBSan).
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>

#include "lang/frontend.h"
#include "lang/internal_error.h"

namespace {
piper::Manifest load(const char* name) {
  std::ifstream in(std::string(PIPER_SOURCE_DIR) + "/tests/manifests/" + name);
  std::ostringstream text;
  text << in.rdbuf();
  piper::SourceManager sm;
  piper::DiagnosticEngine diags(sm);
  auto m = piper::parse_manifest(sm.add(name, text.str()), sm, diags);
  if (!m) __builtin_trap();
  return std::move(*m);
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const piper::Manifest gpt = load("gpt8.json");
  static const piper::Manifest moe = load("moe8.json");
  std::string text(reinterpret_cast<const char*>(data), size);
  // Twice without command-line settings, once with a world size and batch derived from the input
  // (option-dependent arithmetic gets exercised too).
  for (int pass = 0; pass < 3; ++pass) {
    const piper::Manifest* m = pass == 1 ? &moe : &gpt;
    piper::SourceManager sm;
    piper::DiagnosticEngine diags(sm);
    piper::CommandLine cmd;
    cmd.search_path.push_back(PIPER_STRATEGY_DIR);
    if (pass == 2) {
      cmd.np = static_cast<int64_t>(size % 9);  // 0 is a usage error, also worth a try
      cmd.batch_size = static_cast<int64_t>(size % 67);
    }
    // Keep single inputs fast so the fuzzer explores instead of expanding huge loops.
    piper::FileId id = sm.add(std::string(PIPER_STRATEGY_DIR) + "/fuzz.piper", text);
    auto checked = piper::check_text(id, *m, cmd, sm, diags);
    if (checked) {
      // A valid strategy must print back to one that checks again.
      std::string printed = piper::print_strategy(*checked, *m);
      piper::FileId again = sm.add(std::string(PIPER_STRATEGY_DIR) + "/printed.piper", printed);
      piper::DiagnosticEngine diags2(sm);
      if (!piper::check_text(again, *m, cmd, sm, diags2)) __builtin_trap();
    }
    for (const auto& d : diags.all()) (void)diags.render(d);
  }
  return 0;
}
