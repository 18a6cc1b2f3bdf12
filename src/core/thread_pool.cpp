#include "core/thread_pool.h"

#include <sched.h>

#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>

namespace smolrt {

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads < 1 ? 1 : n_threads) {
  workers_.reserve(n_threads_ - 1);
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(m_);
    stop_ = true;
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
    }
  }
}

void ThreadPool::worker_loop() {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lk(m_);
      wake_.wait(lk, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    run_tasks();
    {
      std::lock_guard<std::mutex> lk(m_);
      if (--busy_workers_ == 0) done_.notify_one();
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
  {
    std::lock_guard<std::mutex> lk(m_);
    fn_ = fn;
    n_tasks_ = n_tasks;
    next_task_.store(0, std::memory_order_relaxed);
    busy_workers_ = static_cast<int>(workers_.size());
    error_ = nullptr;
    ++generation_;
  }
  wake_.notify_all();
  run_tasks();
  std::exception_ptr err;
  {
    std::unique_lock<std::mutex> lk(m_);
    done_.wait(lk, [&] { return busy_workers_ == 0; });
    fn_ = TaskFn{};
    err = error_;
    error_ = nullptr;
  }
  if (err) std::rethrow_exception(err);
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
