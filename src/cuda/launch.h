// Kernel launch helper: a plain <<<>>> launch, or cudaLaunchKernelEx with the Programmatic
// Dependent Launch attribute (works inside stream capture), chosen at run time.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "core/cuda_check.h"

namespace smolrt::cuda {

// How a launcher enqueues its kernels: the stream, and the engine's switches (filled once from
// its options; no kernel file reads the environment or a global flag).
struct Launch {
  cudaStream_t stream = nullptr;
  // Programmatic Dependent Launch (Hopper): the next kernel in the stream starts while this one
  // runs and waits in pdl_wait() for its predecessor's writes. Never on the legacy default stream.
  bool pdl = true;
  // Residual GEMMs (gemm) may split K across blocks and add atomically: faster, but the last
  // bits of the residual stream then vary from run to run; false gives bit-reproducible results.
  bool split_k = true;
  // Implicit: a stream alone takes the defaults (tests and benchmarks).
  Launch(cudaStream_t s = nullptr) : stream(s) {}
  Launch(cudaStream_t s, bool pdl_on, bool split) : stream(s), pdl(pdl_on), split_k(split) {}
  bool use_pdl() const { return pdl && stream != nullptr; }
};

// Streaming multiprocessors of the current device (queried once): grid sizing.
int sm_count();

// The dynamic shared memory one block may have on Hopper (227 KiB); kernels above 48 KiB raise
// their limit (cudaFuncAttributeMaxDynamicSharedMemorySize) first.
constexpr int kMaxBlockSmem = 227 * 1024;

// Launch with an explicit choice of the PDL attribute (works inside stream capture).
template <class... KArgs, class... Args>
void launch_kernel_pdl(bool pdl, void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                       cudaStream_t s, Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, static_cast<KArgs>(args)...));
  CUDA_CHECK_LAUNCH();
}

// Every batched-prefill kernel asks for the same L1/shared-memory split (the most shared memory):
// an SM can only hold blocks of kernels with the same split, so kernels with different ones
// cannot overlap under PDL and the SM drains to switch. max_dynamic_smem > 0 also raises the
// kernel's dynamic shared-memory limit. Call once per kernel before its first launch.
template <class... KArgs>
void configure_prefill_kernel(void (*kernel)(KArgs...), int max_dynamic_smem) {
  if (max_dynamic_smem > 0)
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    max_dynamic_smem));
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                  cudaSharedmemCarveoutMaxShared));
}

// Launch with the context's choices.
template <class... KArgs, class... Args>
void launch_kernel(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, const Launch& l,
                   Args&&... args) {
  launch_kernel_pdl(l.use_pdl(), kernel, grid, block, smem, l.stream, std::forward<Args>(args)...);
}

}  // namespace smolrt::cuda
