// A test's scratch file: a per-process path in the temp folder, removed when the object goes (at
// exit for a static one), so that test runs leave nothing behind.
#pragma once
#include <unistd.h>

#include <filesystem>
#include <string>
#include <system_error>

namespace piper::testing {

class ScratchFile {
 public:
  // The path: `stem`-PID`ext` in the temp folder.
  ScratchFile(const std::string& stem, const std::string& ext)
      : path_((std::filesystem::temp_directory_path() / (stem + "-" + std::to_string(::getpid()) + ext)).string()) {}
  ~ScratchFile() {
    std::error_code ignored;  // never written, or already gone
    std::filesystem::remove(path_, ignored);
  }
  ScratchFile(const ScratchFile&) = delete;
  ScratchFile& operator=(const ScratchFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace piper::testing
