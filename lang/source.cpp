#include "lang/source.h"

#include <algorithm>

namespace piper {

FileId SourceManager::add(std::string name, std::string text) {
  File f{std::move(name), std::move(text), {0}};
  for (size_t i = 0; i < f.text.size(); ++i)
    if (f.text[i] == '\n') f.line_starts.push_back(i + 1);
  files_.push_back(std::move(f));
  return static_cast<FileId>(files_.size() - 1);
}

std::string_view SourceManager::line(FileId f, uint32_t line) const {
  const File& file = files_.at(f);
  if (line == 0 || line > file.line_starts.size()) return {};
  size_t begin = file.line_starts[line - 1];
  size_t end = file.text.find('\n', begin);
  if (end == std::string::npos) end = file.text.size();
  if (end > begin && file.text[end - 1] == '\r') --end;
  return std::string_view(file.text).substr(begin, end - begin);
}

SourceLoc SourceManager::loc_at(FileId f, size_t offset, uint32_t length) const {
  const File& file = files_.at(f);
  offset = std::min(offset, file.text.size());
  auto it = std::upper_bound(file.line_starts.begin(), file.line_starts.end(), offset);
  auto line = static_cast<uint32_t>(it - file.line_starts.begin());
  auto col = static_cast<uint32_t>(offset - file.line_starts[line - 1] + 1);
  return SourceLoc{f, line, col, length};
}

}  // namespace piper
