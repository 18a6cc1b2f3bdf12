// CUDA_CHECK: every CUDA runtime call goes through it; a failure throws smolrt::Error naming the
// expression, the CUDA error and file:line. CUDA_CHECK_LAUNCH() after each kernel launch.
#pragma once

#include <cuda_runtime.h>

#include "core/error.h"

#define CUDA_CHECK(expr)                                                                 \
  do {                                                                                   \
    cudaError_t smolrt_err_ = (expr);                                                    \
    if (smolrt_err_ != cudaSuccess) {                                                    \
      ::smolrt::fail("CUDA error in ", #expr, ": ", cudaGetErrorName(smolrt_err_), " (", \
                     cudaGetErrorString(smolrt_err_), ") at ", __FILE__, ":", __LINE__); \
    }                                                                                    \
  } while (0)

#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())
