// The fast CPU matmul (backend/cpu/kernels.h) on one weight: n inputs against a rows x cols matrix
// of a quantized type, per SIMD level. Reports median [min, max] microseconds per call, the weight
// bytes read per second and the int8 multiply-adds per second. Rows x cols defaults to SmolLM2's
// ffn_up (1536 x 576); a matrix far larger than the caches (e.g. 49152 x 576) measures streaming.
//
//   build/bench_cpu_gemm [--type q4_0] [--rows R] [--cols C] [--n N] [--threads T] [--isa L]
//                        [--runs N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cpu/kernels.h"
#include "model/quantize_model.h"
#include "quant/quantize.h"

int main(int argc, char** argv) {
  using namespace smolrt;
  std::string type = "q4_0", isa_name;
  int64_t rows = 1536, cols = 576;
  int n = 1, threads = 0, runs = 30;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const char* v = argv[i + 1];
    if (a == "--type")
      type = v;
    else if (a == "--rows")
      rows = std::atoll(v);
    else if (a == "--cols")
      cols = std::atoll(v);
    else if (a == "--n")
      n = std::atoi(v);
    else if (a == "--threads")
      threads = std::atoi(v);
    else if (a == "--isa")
      isa_name = v;
    else if (a == "--runs")
      runs = std::atoi(v);
    else {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      return 2;
    }
  }
  const GgmlType t = parse_quant_target(type).type;
  const TypeInfo& ti = *type_info(t);
  const size_t rb = row_bytes(ti, uint64_t(cols));
  std::vector<uint8_t> bytes(rb * size_t(rows));
  std::vector<float> row(static_cast<size_t>(cols));
  uint32_t s = 1;
  for (int64_t r = 0; r < rows; ++r) {
    for (float& x : row) {
      s = s * 1664525u + 1013904223u;
      x = float(int32_t(s >> 8) % 2001 - 1000) / 1000.0f;
    }
    quantize_row(t, row.data(), bytes.data() + size_t(r) * rb, cols);
  }
  const TensorView w{"w", t, rows, cols, bytes.data(), bytes.size()};
  const cpu::Isa isa = isa_name.empty() ? cpu::choose_isa() : cpu::parse_isa(isa_name, "--isa");
  auto k = cpu::make_fast_kernels(threads > 0 ? threads : 0, isa, n, cols, 1);
  const cpu::WeightId id = k->add(w);
  std::vector<float> x(size_t(n) * size_t(cols)), out(size_t(n) * size_t(rows));
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(int(i * 7919 % 2001) - 1000) / 500.0f;
  const cpu::MatTarget tg[] = {{id, out.data()}};
  std::vector<double> us;
  for (int r = 0; r <= runs; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    k->matmul(x.data(), n, tg);
    const double dt =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    if (r > 0) us.push_back(dt);
  }
  std::sort(us.begin(), us.end());
  const double med = us[us.size() / 2];
  std::printf(
      "%s %s %lldx%lld n=%d threads=%d: median %.1f us [%.1f, %.1f], %.2f GB/s weights, %.1f "
      "GMAC/s\n",
      cpu::isa_name(isa), type.c_str(), (long long)rows, (long long)cols, n, k->n_threads(), med,
      us.front(), us.back(), double(bytes.size()) / med / 1e3,
      double(rows) * double(cols) * n / med / 1e3);
  return 0;
}
