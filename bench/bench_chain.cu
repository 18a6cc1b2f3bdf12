// bench_chain: cost of one link in a chain of small dependent kernels (a decode step is such a
// chain), for several ways of ordering them:
//   pdl     - Programmatic Dependent Launch: each kernel waits in griddepcontrol.wait for its
//             predecessor's completion, then lets its successor launch (what smolrt does);
//   flag    - PDL launch, successor triggered at once, but the wait is a per-kernel arrival
//             counter that every block of the predecessor bumps (release) after its writes;
//   flag2   - the same, the successor triggered after the wait;
//   plain   - ordinary stream order;
//   persist - one persistent kernel, a software grid barrier (arrival counter) between links.
// Each link reads the whole vector its predecessor wrote (as a matvec stages x) and writes its
// share of the next one: out = mean(in) + 1, so after N links every element is N exactly and a
// stale read shows as a wrong checksum.
//
// It backs a design choice: hardware PDL is the cheapest dependency of these, so a persistent
// decode kernel with software barriers would not beat the kernel chain (flag is the slowest:
// every later kernel launches at once and spins). The measured numbers are in this file's git
// history.
//
//   bench_chain [--kernels N] [--blocks G] [--threads T] [--n LEN] [--reps R]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/cuda_check.h"
#include "cuda/device_common.cuh"
#include "cuda/launch.h"
#include "event_timing.h"

using namespace smolrt;
using namespace smolrt::cuda;

namespace {

constexpr int kMaxThreads = 1024;

__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// One link's work: every block reads all n elements of `in` and writes elements blk, blk+G, ...
// of `out` (G blocks).
__device__ __forceinline__ void link_body(const float* in, float* out, int n, float* red, int blk,
                                          int nblk) {
  float s = 0.f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) s += in[i];
  s = warp_sum(s);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = s;
  __syncthreads();
  float t = 0.f;
  for (int k = 0; k < (int)blockDim.x / 32; ++k) t += red[k];
  for (int i = blk + nblk * (int)threadIdx.x; i < n; i += nblk * (int)blockDim.x)
    out[i] = t / (float)n + 1.f;
}

template <int MODE>  // 0 pdl, 1 flag (trigger first), 2 plain, 3 flag (trigger after the wait)
__global__ void __launch_bounds__(kMaxThreads)
    link_kernel(const float* in, float* out, int n, unsigned* ctr, int idx) {
  __shared__ float red[32];
  if (MODE == 0) {
    pdl_wait();
    pdl_trigger();
  } else if (MODE == 1 || MODE == 3) {
    if (MODE == 1) pdl_trigger();
    if (threadIdx.x == 0) {
      if (idx > 0)
        while (ld_acquire(&ctr[idx - 1]) < gridDim.x) {
        }
      if (idx >= 2 && blockIdx.x == 0) ctr[idx - 2] = 0;  // every block of idx-1 has read it
    }
    __syncthreads();
    if (MODE == 3) pdl_trigger();
  }
  link_body(in, out, n, red, blockIdx.x, gridDim.x);
  if (MODE == 1 || MODE == 3) {
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence();
      atomicAdd(&ctr[idx], 1u);
    }
  }
}

// All links in one persistent kernel, a grid barrier (arrival counter, monotonic target) between
// them: the floor of a single-kernel decode step.
__global__ void __launch_bounds__(kMaxThreads)
    persist_kernel(float* b0, float* b1, int n, unsigned* bar, int links) {
  __shared__ float red[32];
  for (int k = 0; k < links; ++k) {
    link_body((k % 2 == 0) ? b0 : b1, (k % 2 == 0) ? b1 : b0, n, red, blockIdx.x, gridDim.x);
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence();
      atomicAdd(bar, 1u);
      const unsigned target = (unsigned)(k + 1) * gridDim.x;
      while (ld_acquire(bar) < target) {
      }
    }
    __syncthreads();
  }
}

template <int MODE>
void enqueue(int kernels, int blocks, int threads, int n, float* b0, float* b1, unsigned* ctr,
             cudaStream_t s) {
  for (int k = 0; k < kernels; ++k) {
    const float* in = (k % 2 == 0) ? b0 : b1;
    float* out = (k % 2 == 0) ? b1 : b0;
    launch_kernel_pdl(MODE != 2, link_kernel<MODE>, dim3(blocks), dim3(threads), 0, s, in, out, n,
                      ctr, k);
  }
}

}  // namespace

int main(int argc, char** argv) {
  int kernels = 150, blocks = 132, reps = 200, threads = 128, n = 1536;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--kernels")) kernels = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--blocks")) blocks = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--threads")) threads = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--n")) n = std::atoi(argv[i + 1]);
  }
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  float *b0, *b1;
  unsigned* ctr;
  CUDA_CHECK(cudaMalloc(&b0, n * sizeof(float)));
  CUDA_CHECK(cudaMalloc(&b1, n * sizeof(float)));
  CUDA_CHECK(cudaMalloc(&ctr, (kernels + 2) * sizeof(unsigned)));
  cudaStream_t s;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const char* names[5] = {"pdl", "flag", "plain", "flag2", "persist"};
  for (int mode = 0; mode < 5; ++mode) {
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    if (mode == 0) enqueue<0>(kernels, blocks, threads, n, b0, b1, ctr, s);
    if (mode == 1) enqueue<1>(kernels, blocks, threads, n, b0, b1, ctr, s);
    if (mode == 2) enqueue<2>(kernels, blocks, threads, n, b0, b1, ctr, s);
    if (mode == 3) enqueue<3>(kernels, blocks, threads, n, b0, b1, ctr, s);
    if (mode == 4) persist_kernel<<<blocks, threads, 0, s>>>(b0, b1, n, ctr + kernels, kernels);
    CUDA_CHECK(cudaStreamEndCapture(s, &g));
    CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
    // Every repetition's output is checked (before the next one resets the buffers).
    bool ok = true, ran = false;
    auto check = [&] {
      std::vector<float> h(n);
      CUDA_CHECK(
          cudaMemcpy(h.data(), (kernels % 2) ? b1 : b0, n * sizeof(float), cudaMemcpyDeviceToHost));
      for (float v : h) ok = ok && v == (float)kernels;
    };
    const Stat t =
        bench::time_ms([&] { CUDA_CHECK(cudaGraphLaunch(ge, s)); }, reps, s, 5,
                       [&] {
                         if (ran) check();
                         ran = true;
                         CUDA_CHECK(cudaMemsetAsync(b0, 0, n * sizeof(float), s));
                         CUDA_CHECK(cudaMemsetAsync(ctr, 0, (kernels + 2) * sizeof(unsigned), s));
                       });
    check();
    const double med = t.median * 1000.0;
    std::printf(
        "%s  %-7s kernels %d blocks %d x %d threads, n %d: %.1f us per chain, %.3f us per kernel "
        "(min %.1f)  %s\n",
        prop.name, names[mode], kernels, blocks, threads, n, med, med / kernels, t.min * 1000.0,
        ok ? "checksum ok" : "CHECKSUM WRONG");
    CUDA_CHECK(cudaGraphExecDestroy(ge));
    CUDA_CHECK(cudaGraphDestroy(g));
  }
  return 0;
}
