// Kernel launch with Programmatic Dependent Launch (Hopper): the next kernel in the stream is
// launched while this one runs and waits in pdl_wait() until its predecessor has finished and
// its writes are visible. Hides the ~2-4 us launch gap between the many small prefill kernels
// (also inside CUDA graphs). Every kernel launched this way must call pdl_wait() before it
// touches memory a previous kernel wrote.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "cuda/device_common.cuh"
#include "cuda/launch.h"

namespace smolrt::cuda::detail {

using ::smolrt::cuda::pdl_trigger;
using ::smolrt::cuda::pdl_wait;

// Launchers without dynamic shared memory.
template <class... KArgs, class... Args>
void launch_pdl(void (*kernel)(KArgs...), dim3 grid, dim3 block, const Launch& l, Args&&... args) {
  launch_kernel(kernel, grid, block, 0, l, std::forward<Args>(args)...);
}

}  // namespace smolrt::cuda::detail
