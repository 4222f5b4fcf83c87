// Reads a model's manifest text from a manifest .json or from a model.pt (TorchScript zip) archive.
#pragma once
#include <string>
#include <variant>

namespace piper {

// Where TorchScript keeps extra files: `<archive>/extra/<name>`.
inline constexpr const char* kManifestExtraFile = "piper/manifest.json";

struct ModelFileError {
  std::string message;  // complete sentence, says what to do
  bool io = false;      // the file could not be read at all (as opposed to: it is not a valid model)
};

// The manifest JSON text, or why it could not be read. Zip archives are recognised by content.
std::variant<std::string, ModelFileError> read_manifest_text(const std::string& path);

}  // namespace piper
