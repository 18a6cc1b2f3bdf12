// RMSNorm of one vector: out[i] = x[i] * rsqrt(mean(x^2) + eps) * w[i], i < n. out may alias x.
#pragma once

#include <cuda_runtime.h>

#include "cuda/launch.h"

namespace smolrt::cuda {

void rmsnorm(float* out, const float* x, const float* w, int n, float eps, const Launch& s);

// Post-norm residual (gemma3's post_attention_norm / post_ffw_norm): for each of `rows` rows,
// x[r][i] += y[r][i] * rsqrt(mean(y[r]^2) + eps) * w[i], i < n. Row pitches ldx, ldy >= n.
void rmsnorm_add(float* x, int ldx, const float* y, int ldy, const float* w, int n, int rows,
                 float eps, const Launch& s);

}  // namespace smolrt::cuda
