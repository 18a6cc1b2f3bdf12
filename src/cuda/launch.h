// Kernel launch helper: a plain <<<>>> launch, or cudaLaunchKernelEx with the Programmatic
// Dependent Launch attribute (works inside stream capture), chosen at run time.
#pragma once

#include <cuda_runtime.h>

#include "core/cuda_check.h"

namespace smolrt::cuda {

// Process-wide switch read by every decode launcher (set by the CUDA backend per step).
bool& pdl_enabled();

template <class... KArgs, class... Args>
void launch_kernel(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                   Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl_enabled() ? 1 : 0;
  CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, static_cast<KArgs>(args)...));
  CUDA_CHECK_LAUNCH();
}

}  // namespace smolrt::cuda
