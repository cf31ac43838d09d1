// A driver for frame_fuzzer.cpp where libFuzzer is not available (GCC builds, and the
// sanitizer builds of the test suite): runs every seed, then a fixed number of
// deterministic mutations of them (bit flips, overwritten header fields, cuts, splices),
// then any files named on the command line. The same entry point as under libFuzzer, so a
// crash file found by scripts/run-fuzz.sh can be replayed here too.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <vector>

std::vector<std::vector<unsigned char>> offload_fuzz_seeds();
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv);

int main(int argc, char** argv) {
  LLVMFuzzerInitialize(&argc, &argv);  // --write-seeds DIR
  auto seeds = offload_fuzz_seeds();
  for (auto& s : seeds) LLVMFuzzerTestOneInput(s.data(), s.size());
  std::mt19937 rng(7);
  const int kRuns = 20000;
  for (int i = 0; i < kRuns; ++i) {
    std::vector<unsigned char> s = seeds[rng() % seeds.size()];
    int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits && !s.empty(); ++e) {
      size_t at = rng() % s.size();
      switch (rng() % 6) {
        case 0: s[at] ^= static_cast<unsigned char>(1u << (rng() % 8)); break;
        case 1: s[at] = static_cast<unsigned char>(rng()); break;
        case 2: {  // a header field to an edge value: 0, all ones, or one off
          static const uint32_t kEdges[] = {0, 1, 0xFF, 0xFFFF, 0xFFFFFFFF, 31, 32, 184, 152};
          uint32_t v = kEdges[rng() % (sizeof kEdges / sizeof kEdges[0])];
          size_t n = std::min<size_t>(4, s.size() - at);
          std::memcpy(&s[at], &v, n);
          break;
        }
        case 3: s.resize(at); break;  // cut
        case 4: {                     // splice another seed in
          auto& o = seeds[rng() % seeds.size()];
          s.insert(s.begin() + static_cast<std::ptrdiff_t>(at), o.begin() + 1, o.end());
          break;
        }
        default: s.insert(s.begin() + static_cast<std::ptrdiff_t>(at), static_cast<unsigned char>(rng())); break;
      }
    }
    LLVMFuzzerTestOneInput(s.data(), s.size());
  }
  int files = 0;
  for (int i = 1; i < argc; ++i) {
    if (argv[i][0] == '-') continue;
    std::ifstream f(argv[i], std::ios::binary);
    std::vector<unsigned char> s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    LLVMFuzzerTestOneInput(s.data(), s.size());
    ++files;
  }
  std::printf("frame_fuzzer (standalone): %zu seeds, %d mutations, %d files: no invariant broken\n", seeds.size(),
              kRuns, files);
  return 0;
}
