// A decode step allocates nothing: the CPU forward (oracle and fast path, 1 and 2 threads) sizes
// every buffer when the backend is built. This file replaces the global operator new for the whole
// test binary with one that counts calls while a test arms it (and otherwise only forwards to
// malloc), so any heap allocation inside a step is seen, on any thread.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>

#include "backend/backend.h"
#include "cpu_test_util.h"

namespace {
std::atomic<bool> g_armed{false};
std::atomic<long> g_news{0};

void* counted(std::size_t n, std::size_t align) {
  if (g_armed.load(std::memory_order_relaxed)) g_news.fetch_add(1, std::memory_order_relaxed);
  if (n == 0) n = 1;
  void* p = align > alignof(std::max_align_t)
                ? std::aligned_alloc(align, (n + align - 1) / align * align)
                : std::malloc(n);
  if (!p) throw std::bad_alloc();
  return p;
}
}  // namespace

void* operator new(std::size_t n) {
  return counted(n, 0);
}
void* operator new[](std::size_t n) {
  return counted(n, 0);
}
void* operator new(std::size_t n, std::align_val_t a) {
  return counted(n, std::size_t(a));
}
void* operator new[](std::size_t n, std::align_val_t a) {
  return counted(n, std::size_t(a));
}
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete[](void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::size_t) noexcept {
  std::free(p);
}
void operator delete(void* p, std::align_val_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::align_val_t) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t, std::align_val_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept {
  std::free(p);
}

namespace smolrt {
namespace {

// The tiny model's default mix: Q4_0, Q8_0, F16, Q4_1, BF16, F32 matrices.
TEST(CpuNoAlloc, DecodeStepsAllocateNothing) {
  const auto tm = test::make_tiny_model({}, 9);
  for (const char* kind : {"cpu", "cpu-ref"}) {
    for (int threads : {1, 2}) {
      auto be = make_cpu_backend(tm->model, BackendOptions{kind, 64, threads});
      const std::vector<int> prompt = {1, 5, 9, 14, 3, 7};
      be->forward_prompt(prompt);
      int t = be->forward_token_greedy(4, 6);  // a first step outside the count
      g_news = 0;
      g_armed = true;
      for (int i = 0; i < 16; ++i) t = be->forward_token_greedy(t, be->position());
      be->forward_token(t, be->position());
      g_armed = false;
      EXPECT_EQ(g_news.load(), 0) << kind << " with " << threads << " threads";
    }
  }
}

}  // namespace
}  // namespace smolrt
