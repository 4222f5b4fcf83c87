#include "lang/model_file.h"

#include <doctest/doctest.h>
#include <zip.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "tests/lang_fixture.h"

using namespace piper;
namespace fs = std::filesystem;

namespace {
// Writes a zip laid out like torch.jit.save's: `<archive>/data.pkl`, `<archive>/extra/...`.
void write_zip(const fs::path& path, const std::vector<std::pair<std::string, std::string>>& entries) {
  int err = 0;
  zip_t* z = zip_open(path.c_str(), ZIP_CREATE | ZIP_TRUNCATE, &err);
  REQUIRE(z);
  for (const auto& [name, data] : entries) {
    zip_source_t* src = zip_source_buffer(z, data.data(), data.size(), 0);
    REQUIRE(zip_file_add(z, name.c_str(), src, ZIP_FL_OVERWRITE) >= 0);
  }
  REQUIRE(zip_close(z) == 0);
}

fs::path temp_path(const std::string& name) {
  return fs::temp_directory_path() / ("piper-test-" + std::to_string(::getpid()) + "-" + name);
}
}  // namespace

TEST_CASE("the manifest is read from a model.pt archive's extra file") {
  std::string manifest = testing::read_file(testing::source_path("tests/manifests/gpt8.json"));
  fs::path p = temp_path("model.pt");
  write_zip(p, {{"model/data.pkl", "not really a pickle"}, {"model/extra/piper/manifest.json", manifest}});
  auto text = read_manifest_text(p.string());
  REQUIRE(std::holds_alternative<std::string>(text));
  CHECK(std::get<std::string>(text) == manifest);
  fs::remove(p);
}

TEST_CASE("model files that are missing, corrupt or lack a manifest get clear errors") {
  auto missing = read_manifest_text("/nonexistent/model.pt");
  REQUIRE(std::holds_alternative<ModelFileError>(missing));
  CHECK(std::get<ModelFileError>(missing).io);

  fs::path p = temp_path("nomanifest.pt");
  write_zip(p, {{"model/data.pkl", "x"}});
  auto none = read_manifest_text(p.string());
  REQUIRE(std::holds_alternative<ModelFileError>(none));
  CHECK(!std::get<ModelFileError>(none).io);
  CHECK(std::get<ModelFileError>(none).message.find("has no piper/manifest.json") != std::string::npos);

  // A zip signature followed by garbage: a truncated or corrupt download.
  std::ofstream(p, std::ios::binary) << std::string("PK\x03\x04", 4) << std::string(100, '\xab');
  auto corrupt = read_manifest_text(p.string());
  REQUIRE(std::holds_alternative<ModelFileError>(corrupt));
  CHECK(std::get<ModelFileError>(corrupt).message.find("cannot read as a model.pt archive") != std::string::npos);
  fs::remove(p);
}
