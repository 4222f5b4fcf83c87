#include "lang/model_file.h"

#include <fmt/format.h>
#include <zip.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>

namespace piper {

namespace {
std::variant<std::string, ModelFileError> read_from_zip(const std::string& path) {
  int err = 0;
  std::unique_ptr<zip_t, decltype(&zip_close)> archive(zip_open(path.c_str(), ZIP_RDONLY, &err), &zip_close);
  if (!archive) {
    zip_error_t ze;
    zip_error_init_with_code(&ze, err);
    std::string why = zip_error_strerror(&ze);
    zip_error_fini(&ze);
    return ModelFileError{fmt::format("{}: cannot read as a model.pt archive: {}", path, why)};
  }
  const std::string suffix = std::string("/extra/") + kManifestExtraFile;
  zip_int64_t n = zip_get_num_entries(archive.get(), 0);
  for (zip_int64_t i = 0; i < n; ++i) {
    const char* name = zip_get_name(archive.get(), i, 0);
    if (!name) continue;
    std::string_view entry(name);
    if (entry.size() < suffix.size() || entry.substr(entry.size() - suffix.size()) != suffix) continue;
    zip_stat_t st;
    if (zip_stat_index(archive.get(), i, 0, &st) != 0 || !(st.valid & ZIP_STAT_SIZE))
      return ModelFileError{fmt::format("{}: cannot read entry {}", path, entry)};
    if (st.size > (64u << 20))
      return ModelFileError{fmt::format("{}: {} is {} bytes, too large for a manifest", path, entry, st.size)};
    std::unique_ptr<zip_file_t, decltype(&zip_fclose)> file(zip_fopen_index(archive.get(), i, 0), &zip_fclose);
    if (!file) return ModelFileError{fmt::format("{}: cannot open entry {}", path, entry)};
    std::string text(st.size, '\0');
    zip_int64_t got = zip_fread(file.get(), text.data(), st.size);
    if (got < 0 || static_cast<zip_uint64_t>(got) != st.size)
      return ModelFileError{fmt::format("{}: entry {} is truncated or corrupt", path, entry)};
    return text;
  }
  return ModelFileError{fmt::format(
      "{}: this model archive has no {} (save it with piper-model or python/piper_export.py, "
      "which embed the region manifest)",
      path, kManifestExtraFile)};
}
}  // namespace

std::variant<std::string, ModelFileError> read_manifest_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return ModelFileError{fmt::format("{}: cannot open: {}", path, std::strerror(errno)), true};
  char magic[4] = {};
  in.read(magic, 4);
  if (in.gcount() == 4 && magic[0] == 'P' && magic[1] == 'K' && magic[2] == 3 && magic[3] == 4) {
    in.close();
    return read_from_zip(path);
  }
  in.clear();
  in.seekg(0);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace piper
