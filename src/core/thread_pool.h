// A small persistent thread pool for the CPU backend: workers are created once, so a matvec never
// pays for thread creation. Between calls a worker spins for a short while (kSpin) before it
// sleeps on a condition variable, and so does the caller waiting for the workers: a decode step
// makes a few parallel calls per layer with microseconds of serial work between them, and a
// futex wake-up each time cost more than the matvecs.
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
  // The fast path is lock-free (the atomics below, sequentially consistent where a sleeper's flag
  // meets the state it waits for); m_ is taken only to sleep, to wake a sleeper, or to record an
  // exception.
  std::mutex m_;
  std::condition_variable wake_;
  std::condition_variable done_;
  std::atomic<uint64_t> generation_{0};  // bumped per call; workers start when it changes
  std::atomic<bool> stop_{false};
  std::atomic<int> busy_workers_{0};
  std::atomic<int> sleepers_{0};           // workers asleep (or about to be) on wake_
  std::atomic<bool> caller_waits_{false};  // the caller asleep (or about to be) on done_
  std::atomic<bool> failed_{false};        // error_ is set
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
