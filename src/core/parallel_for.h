// parallel_for: splits [0, n) into contiguous chunks over a few std::threads. Used by the CPU-side
// bulk work (quantize, synth) whose results must not depend on the thread count: each index is
// computed independently, so the output is identical for any number of threads.
#pragma once

#include <algorithm>
#include <cstdint>
#include <exception>
#include <thread>
#include <vector>

namespace smolrt {

// Threads to use: hardware_concurrency capped at `cap` (at least 1).
inline int worker_count(int cap = 8) {
  const unsigned hw = std::thread::hardware_concurrency();
  return std::max(1, std::min(cap, static_cast<int>(hw ? hw : 1)));
}

// Calls fn(begin, end) on disjoint chunks covering [0, n). The first exception thrown by any
// chunk (lowest chunk index) is rethrown on the calling thread after all threads have joined.
template <class Fn>
void parallel_for(int64_t n, int64_t min_chunk, Fn&& fn) {
  if (n <= 0) return;
  const int64_t max_threads = std::max<int64_t>(1, n / std::max<int64_t>(1, min_chunk));
  const int threads = static_cast<int>(std::min<int64_t>(worker_count(), max_threads));
  if (threads <= 1) {
    fn(int64_t{0}, n);
    return;
  }
  std::vector<std::exception_ptr> errors(static_cast<size_t>(threads));
  std::vector<std::thread> pool;
  const int64_t step = (n + threads - 1) / threads;
  for (int t = 0; t < threads; ++t) {
    const int64_t b = t * step, e = std::min(n, b + step);
    if (b >= e) break;
    pool.emplace_back([&, t, b, e] {
      try {
        fn(b, e);
      } catch (...) {
        errors[static_cast<size_t>(t)] = std::current_exception();
      }
    });
  }
  for (std::thread& th : pool) th.join();
  for (const std::exception_ptr& ep : errors) {
    if (ep) std::rethrow_exception(ep);
  }
}

}  // namespace smolrt
