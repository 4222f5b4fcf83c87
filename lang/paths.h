// Where Piper's shared files live (strategy library, corpus, exporter): beside an installed tool, or in the source tree.
#pragma once
#include <string>

namespace piper {

// `<prefix>/share/piper` when the running program sits in `<prefix>/bin` of an installation,
// else the source tree it was built from. Both hold strategies/, data/ and python/.
std::string share_dir();

}  // namespace piper
