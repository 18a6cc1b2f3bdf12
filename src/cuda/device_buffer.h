// RAII owners for device memory and pinned host memory. Allocation failures throw smolrt::Error
// naming what was being allocated, its size and the device's free memory.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <string>
#include <utility>

namespace smolrt::cuda {

// Throws Error "GPU out of memory ..." (or the CUDA error) for a failed allocation of `bytes`.
[[noreturn]] void fail_alloc(cudaError_t err, size_t bytes, const std::string& what);

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(size_t bytes, const std::string& what);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(o.n_) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return p_; }
  size_t size() const { return n_; }

 private:
  void* p_ = nullptr;
  size_t n_ = 0;
};

class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  PinnedBuffer(size_t bytes, const std::string& what);
  ~PinnedBuffer();
  PinnedBuffer(PinnedBuffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(o.n_) {}
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  void* get() const { return p_; }
  size_t size() const { return n_; }

 private:
  void* p_ = nullptr;
  size_t n_ = 0;
};

// Carves 256-byte-aligned sub-ranges out of one allocation, in two passes: size, then place.
class Carver {
 public:
  explicit Carver(char* base = nullptr) : base_(base) {}
  // Returns base + offset (nullptr-based when sizing) and advances.
  template <class T>
  T* take(size_t count) {
    off_ = (off_ + 255) & ~size_t{255};
    T* p = reinterpret_cast<T*>(base_ + off_);
    off_ += count * sizeof(T);
    return p;
  }
  size_t used() const { return (off_ + 255) & ~size_t{255}; }

 private:
  char* base_;
  size_t off_ = 0;
};

}  // namespace smolrt::cuda
