#include "lang/paths.h"

#include <filesystem>

namespace piper {

std::string share_dir() {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const fs::path installed = exe.parent_path().parent_path() / "share" / "piper";
    if (fs::is_directory(installed / "strategies", ec)) return installed.string();
  }
  return PIPER_SOURCE_DIR;
}

}  // namespace piper
