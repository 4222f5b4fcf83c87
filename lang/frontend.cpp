#include "lang/frontend.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "lang/model_file.h"
#include "lang/paths.h"

namespace piper {

std::vector<std::string> default_search_path() {
  std::vector<std::string> out;
  if (const char* env = std::getenv("PIPER_STRATEGY_PATH")) {
    std::string s = env;
    size_t start = 0;
    while (start <= s.size()) {
      size_t colon = s.find(':', start);
      std::string part = s.substr(start, colon == std::string::npos ? std::string::npos : colon - start);
      if (!part.empty()) out.push_back(part);
      if (colon == std::string::npos) break;
      start = colon + 1;
    }
  }
  out.push_back(share_dir() + "/strategies");
  return out;
}

FrontendResult load_model(const std::string& model_path, SourceManager& sources, DiagnosticEngine& diags) {
  FrontendResult r;
  auto text = read_manifest_text(model_path);
  if (auto* err = std::get_if<ModelFileError>(&text)) {
    // A missing file is an I/O problem; an archive without a manifest is a problem with the model.
    r.status = err->io ? FrontendStatus::IoError : FrontendStatus::Invalid;
    r.io_error = err->message;
    if (r.status == FrontendStatus::Invalid) diags.error(SourceLoc{}, err->message);
    return r;
  }
  FileId id = sources.add(model_path, std::move(std::get<std::string>(text)));
  r.manifest = parse_manifest(id, sources, diags);
  if (!r.manifest) r.status = FrontendStatus::Invalid;
  return r;
}

std::optional<CheckedStrategy> check_text(FileId strategy, const Manifest& m, const CommandLine& cmd,
                                          SourceManager& sources, DiagnosticEngine& diags) {
  CheckOptions opt;
  opt.world = cmd.np;
  opt.batch_size = cmd.batch_size;
  opt.search_path = cmd.search_path;
  // Lay the settings out as text: `--np 4 --set pp=2 --set mb=8`.
  std::string text;
  std::vector<std::pair<size_t, std::string>> sets;
  size_t np_at = 0;
  if (cmd.np) {
    np_at = text.size();
    text += fmt::format("--np {} ", *cmd.np);
  }
  for (const auto& s : cmd.sets) {
    sets.emplace_back(text.size() + 6, s);
    text += fmt::format("--set {} ", s);
  }
  FileId line = sources.add("<command line>", text);
  if (cmd.np) opt.world_loc = sources.loc_at(line, np_at, static_cast<uint32_t>(text.find(' ', np_at + 5) - np_at));
  bool bad = false;
  for (const auto& [at, s] : sets) {
    SourceLoc loc = sources.loc_at(line, at, static_cast<uint32_t>(s.size()));
    size_t eq = s.find('=');
    if (eq == std::string::npos || eq == 0) {
      diags.error(loc, fmt::format("--set expects NAME=VALUE, got '{}'", s));
      bad = true;
      continue;
    }
    opt.overrides.push_back(Override{s.substr(0, eq), s.substr(eq + 1), loc});
  }
  if (cmd.np && *cmd.np < 1) {
    diags.error(opt.world_loc, fmt::format("--np must be at least 1, got {}", *cmd.np));
    bad = true;
  }
  if (cmd.batch_size && *cmd.batch_size < 1) {
    diags.error(SourceLoc{}, fmt::format("--batch-size must be at least 1, got {}", *cmd.batch_size));
    bad = true;
  }
  if (bad) return std::nullopt;
  return check_strategy(strategy, m, opt, sources, diags);
}

FrontendResult run_frontend(const std::string& model_path, const std::string& strategy_path, const CommandLine& cmd,
                            SourceManager& sources, DiagnosticEngine& diags) {
  FrontendResult r = load_model(model_path, sources, diags);
  if (r.status == FrontendStatus::IoError) return r;
  std::ifstream in(strategy_path, std::ios::binary);
  if (!in) {
    r.status = FrontendStatus::IoError;
    r.io_error = fmt::format("{}: cannot open: {}", strategy_path, std::strerror(errno));
    return r;
  }
  std::ostringstream text;
  text << in.rdbuf();
  FileId id = sources.add(strategy_path, text.str());
  if (!r.manifest) return r;  // model errors are reported; the strategy cannot be checked without it
  r.strategy = check_text(id, *r.manifest, cmd, sources, diags);
  if (!r.strategy) r.status = FrontendStatus::Invalid;
  return r;
}

}  // namespace piper
