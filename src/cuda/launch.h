// Kernel launch helper: a plain <<<>>> launch, or cudaLaunchKernelEx with the Programmatic
// Dependent Launch attribute (works inside stream capture), chosen at run time.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "core/cuda_check.h"

namespace smolrt::cuda {

// Process-wide switch read by every decode launcher (set by the CUDA backend per step).
bool& pdl_enabled();

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

// Decode launchers: PDL as the process-wide switch says.
template <class... KArgs, class... Args>
void launch_kernel(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                   Args&&... args) {
  launch_kernel_pdl(pdl_enabled(), kernel, grid, block, smem, s, std::forward<Args>(args)...);
}

}  // namespace smolrt::cuda
