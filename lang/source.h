// Source files and locations: the text every diagnostic points into.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace piper {

using FileId = uint32_t;
inline constexpr FileId kNoFile = UINT32_MAX;  // a diagnostic about no file in particular

struct SourceLoc {
  FileId file = kNoFile;
  uint32_t line = 0;    // 1-based; 0 means "no location"
  uint32_t col = 0;     // 1-based, in bytes
  uint32_t length = 1;  // how many bytes the caret underlines
  bool valid() const { return line > 0; }
  friend bool operator==(const SourceLoc&, const SourceLoc&) = default;
};

class SourceManager {
 public:
  // Registers a buffer; the name is what diagnostics print (a path, or "<command line>").
  FileId add(std::string name, std::string text);
  const std::string& name(FileId f) const { return files_.at(f).name; }
  const std::string& text(FileId f) const { return files_.at(f).text; }
  std::string_view line(FileId f, uint32_t line) const;
  // Maps a byte offset to a location (used for JSON errors, which report offsets).
  SourceLoc loc_at(FileId f, size_t offset, uint32_t length = 1) const;
  size_t size() const { return files_.size(); }

 private:
  struct File {
    std::string name, text;
    std::vector<size_t> line_starts;
  };
  std::vector<File> files_;
};

}  // namespace piper
