// A small persistent thread pool for the CPU backend: workers are created once and sleep on a
// condition variable between calls, so a matvec never pays for thread creation.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace smolrt {

class ThreadPool {
 public:
  // n_threads participants in total: the calling thread plus n_threads - 1 workers (n_threads >=
  // 1).
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Runs fn(i) for every i in [0, n_tasks) on the caller and the workers; returns when all are
  // done. Tasks are handed out dynamically (an atomic counter). Calls from different threads are
  // serialized; fn must not call parallel_for on the same pool (it would deadlock). An exception
  // thrown by fn is rethrown in the caller after every task has finished. fn is called through a
  // plain reference (no std::function), so a call allocates nothing.
  template <class Fn>
  void parallel_for(int n_tasks, const Fn& fn) {
    run(n_tasks, TaskFn{&fn, [](const void* f, int i) { (*static_cast<const Fn*>(f))(i); }});
  }

 private:
  struct TaskFn {
    const void* obj = nullptr;
    void (*call)(const void*, int) = nullptr;
  };
  void run(int n_tasks, TaskFn fn);
  void worker_loop();
  void run_tasks();

  int n_threads_;
  std::vector<std::thread> workers_;
  std::mutex call_mutex_;  // one parallel_for at a time
  std::mutex m_;
  std::condition_variable wake_;
  std::condition_variable done_;
  uint64_t generation_ = 0;  // bumped per call; workers wake when it changes
  bool stop_ = false;
  int busy_workers_ = 0;
  TaskFn fn_;
  int n_tasks_ = 0;
  std::atomic<int> next_task_{0};
  std::exception_ptr error_;
};

// A process-wide pool with exactly n_threads participants (0 = default_thread_count()), created on
// first use for each distinct size and kept until exit.
ThreadPool& shared_thread_pool(int n_threads);

// The physical cores among the CPUs this process may run on (sched_getaffinity and sysfs
// topology), else hardware_concurrency(); at least 1.
int default_thread_count();

}  // namespace smolrt
