// Runs the fuzz target over files given on the command line (a seed corpus), without libFuzzer:
// a quick regression test in the ordinary build, and a way to replay a crash input.
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int main(int argc, char** argv) {
  int ran = 0;
  for (int i = 1; i < argc; ++i) {
    std::ifstream in(argv[i], std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "fuzz-replay: cannot open %s\n", argv[i]);
      return 2;
    }
    std::ostringstream s;
    s << in.rdbuf();
    std::string data = s.str();
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(data.data()), data.size());
    ++ran;
  }
  std::printf("fuzz-replay: %d inputs, no crash\n", ran);
  return 0;
}
