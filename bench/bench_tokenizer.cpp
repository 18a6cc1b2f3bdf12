// Tokenizer encode throughput on English prose with the SmolLM2 vocabulary (tokenizer.json from
// the fixtures), one thread. Prose: the files given on the command line, else the English licence
// texts every Debian system ships (/usr/share/common-licenses, ~250 KB). Validates first (decode
// gives the text back), then reports the cold first pass (empty word cache) and the median,
// min and max of warm passes in MB/s, by thread CPU time and by wall time.
//
//   build/bench_tokenizer [--runs N] [--tokenizer tokenizer.json] [file ...]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/paths.h"
#include "tokenizer/tokenizer.h"

namespace fs = std::filesystem;

namespace {

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Wall and this thread's CPU seconds. CPU time is the one-core figure on a shared machine (other
// processes preempting us inflate wall time, not CPU time); both are printed.
struct Clock {
  std::chrono::steady_clock::time_point wall = std::chrono::steady_clock::now();
  double cpu = thread_cpu();
  static double thread_cpu() {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
  }
  double wall_s() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - wall).count();
  }
  double cpu_s() const { return thread_cpu() - cpu; }
};

}  // namespace

int main(int argc, char** argv) {
  int runs = 20;
  fs::path tok_path = smolrt::fixtures_dir() / "tokenizers/smollm2-135m/tokenizer.json";
  std::vector<fs::path> files;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--runs" && i + 1 < argc) {
      runs = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--tokenizer" && i + 1 < argc) {
      tok_path = argv[++i];
    } else {
      files.emplace_back(a);
    }
  }
  if (files.empty() && fs::is_directory("/usr/share/common-licenses")) {
    for (const auto& e : fs::directory_iterator("/usr/share/common-licenses")) {
      if (e.is_regular_file() && !e.is_symlink()) files.push_back(e.path());
    }
    std::sort(files.begin(), files.end());
  }
  std::string text;
  for (const auto& f : files) text += read_file(f);
  if (text.empty()) {
    std::fprintf(stderr, "bench_tokenizer: no prose found; pass text files as arguments\n");
    return 1;
  }
  if (!fs::exists(tok_path)) {
    std::fprintf(stderr, "bench_tokenizer: skipped: %s not found; set SMOLRT_FIXTURES\n",
                 tok_path.c_str());
    return 0;
  }
  try {
    const smolrt::Tokenizer tok(smolrt::vocab_from_hf_json(tok_path.string()));
    const double mb = static_cast<double>(text.size()) / 1e6;

    const Clock c0;
    const std::vector<int> ids = tok.encode(text, false);
    const double cold_wall = c0.wall_s(), cold_cpu = c0.cpu_s();
    if (tok.decode(ids) != text) {
      std::fprintf(stderr, "bench_tokenizer: decode(encode(text)) != text; not timing\n");
      return 1;
    }
    std::vector<double> wall, cpu;  // MB/s per run
    for (int r = 0; r < runs; ++r) {
      const Clock c;
      const std::vector<int> again = tok.encode(text, false);
      wall.push_back(mb / c.wall_s());
      cpu.push_back(mb / c.cpu_s());
      if (again != ids) return 1;
    }
    std::sort(wall.begin(), wall.end());
    std::sort(cpu.begin(), cpu.end());
    std::printf(
        "tokenizer encode, SmolLM2 vocab, 1 thread: %.3f MB prose -> %zu tokens "
        "(%.2f bytes/token)\n",
        mb, ids.size(), static_cast<double>(text.size()) / static_cast<double>(ids.size()));
    std::printf("  cold (first pass, empty word cache): %.1f MB/s wall, %.1f MB/s cpu\n",
                mb / cold_wall, mb / cold_cpu);
    std::printf(
        "  warm, %d runs: median %.1f MB/s cpu (min %.1f, max %.1f); median %.1f MB/s wall "
        "(min %.1f, max %.1f)\n",
        runs, cpu[cpu.size() / 2], cpu.front(), cpu.back(), wall[wall.size() / 2], wall.front(),
        wall.back());
  } catch (const smolrt::Error& e) {
    std::fprintf(stderr, "bench_tokenizer: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
