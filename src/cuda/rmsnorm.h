// RMSNorm of one vector: out[i] = x[i] * rsqrt(mean(x^2) + eps) * w[i], i < n. out may alias x.
#pragma once

#include <cuda_runtime.h>

namespace smolrt::cuda {

void rmsnorm(float* out, const float* x, const float* w, int n, float eps, cudaStream_t s);

}  // namespace smolrt::cuda
