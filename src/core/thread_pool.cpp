#include "core/thread_pool.h"

#include <sched.h>

#include <chrono>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>

namespace smolrt {

namespace {

// How long a waiting thread spins before it sleeps: longer than the serial work between a decode
// step's parallel calls (norms, RoPE: a few microseconds), yet short, because on a machine shared
// with other work a spinning thread holds a core that the thread it waits for may need (on 2 busy
// cores, 200 us spins made decode 2-4x slower than sleeping at once; 20 us did not).
constexpr std::chrono::microseconds kSpin{20};

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Polls ready() for up to kSpin; whether it became true.
template <class Ready>
bool spin_until(const Ready& ready) {
  const auto end = std::chrono::steady_clock::now() + kSpin;
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      if (ready()) return true;
      cpu_relax();
    }
    if (std::chrono::steady_clock::now() > end) return ready();
  }
}

}  // namespace

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads < 1 ? 1 : n_threads) {
  workers_.reserve(n_threads_ - 1);
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(m_);
    stop_.store(true);
  }
  wake_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::run_tasks() {
  for (;;) {
    const int i = next_task_.fetch_add(1, std::memory_order_relaxed);
    if (i >= n_tasks_) return;
    try {
      fn_.call(fn_.obj, i);
    } catch (...) {
      std::lock_guard<std::mutex> lk(m_);
      if (!error_) error_ = std::current_exception();
      failed_.store(true);
    }
  }
}

void ThreadPool::worker_loop() {
  uint64_t seen = 0;
  auto called = [&] { return stop_.load() || generation_.load() != seen; };
  for (;;) {
    if (!spin_until(called)) {
      std::unique_lock<std::mutex> lk(m_);
      sleepers_.fetch_add(1);
      wake_.wait(lk, called);
      sleepers_.fetch_sub(1);
    }
    if (stop_.load()) return;
    seen = generation_.load();
    run_tasks();
    if (busy_workers_.fetch_sub(1) == 1 && caller_waits_.load()) {
      std::lock_guard<std::mutex> lk(m_);  // the caller is waiting, or will see busy_workers_ 0
      done_.notify_one();
    }
  }
}

void ThreadPool::run(int n_tasks, TaskFn fn) {
  if (n_tasks <= 0) return;
  std::lock_guard<std::mutex> call(call_mutex_);
  if (workers_.empty() || n_tasks == 1) {
    for (int i = 0; i < n_tasks; ++i) fn.call(fn.obj, i);
    return;
  }
  // The call's fields are published by generation_'s increment.
  fn_ = fn;
  n_tasks_ = n_tasks;
  next_task_.store(0, std::memory_order_relaxed);
  busy_workers_.store(static_cast<int>(workers_.size()));
  generation_.fetch_add(1);
  if (sleepers_.load() > 0) {
    { std::lock_guard<std::mutex> lk(m_); }  // a sleeper is in wait() or will see generation_
    wake_.notify_all();
  }
  run_tasks();
  auto done = [&] { return busy_workers_.load() == 0; };
  if (!spin_until(done)) {
    std::unique_lock<std::mutex> lk(m_);
    caller_waits_.store(true);
    done_.wait(lk, done);
    caller_waits_.store(false);
  }
  fn_ = TaskFn{};
  if (failed_.load()) {
    std::exception_ptr err;
    {
      std::lock_guard<std::mutex> lk(m_);
      err = error_;
      error_ = nullptr;
      failed_.store(false);
    }
    std::rethrow_exception(err);
  }
}

int default_thread_count() {
  // Physical cores among the CPUs this process may run on: a second hyperthread of a core adds
  // little to bandwidth-bound matmuls and makes every thread of a split wait for the slowest.
  static const int n = [] {
    cpu_set_t set;
    std::set<std::pair<std::string, std::string>> cores;
    int logical = 0;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
      for (int c = 0; c < CPU_SETSIZE; ++c) {
        if (!CPU_ISSET(c, &set)) continue;
        ++logical;
        const std::string dir = "/sys/devices/system/cpu/cpu" + std::to_string(c) + "/topology/";
        std::ifstream pkg(dir + "physical_package_id"), core(dir + "core_id");
        std::string p, k;
        if (!(pkg >> p) || !(core >> k)) return logical > 0 ? logical : 1;  // no topology: logical
        cores.emplace(p, k);
      }
    }
    if (!cores.empty()) return static_cast<int>(cores.size());
    const unsigned hw = std::thread::hardware_concurrency();
    return hw == 0 ? 1 : static_cast<int>(hw);
  }();
  return n;
}

ThreadPool& shared_thread_pool(int n_threads) {
  static std::mutex mu;
  static std::map<int, std::unique_ptr<ThreadPool>> pools;
  if (n_threads <= 0) n_threads = default_thread_count();
  std::lock_guard<std::mutex> lk(mu);
  std::unique_ptr<ThreadPool>& p = pools[n_threads];
  if (!p) p = std::make_unique<ThreadPool>(n_threads);
  return *p;
}

}  // namespace smolrt
