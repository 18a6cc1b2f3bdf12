// embed_rows and argmax_rows (see prefill_ops.h).
#include "cuda/prefill_ops.h"

#include <cuda_fp16.h>

#include <cmath>

#include "core/cuda_check.h"
#include "core/error.h"
#include "cuda/launch.cuh"

namespace smolrt::cuda {
namespace {

__device__ __forceinline__ float h2f(uint16_t h) {
  return __half2float(__ushort_as_half(h));
}

__device__ float table_value(const void* table, GgmlType type, size_t row_bytes, int tok, int c) {
  const char* row = static_cast<const char*>(table) + (size_t)tok * row_bytes;
  switch (type) {
    case GgmlType::F32:
      return reinterpret_cast<const float*>(row)[c];
    case GgmlType::F16:
      return h2f(reinterpret_cast<const uint16_t*>(row)[c]);
    case GgmlType::BF16:
      return bf16_to_f32(reinterpret_cast<const uint16_t*>(row)[c]);
    case GgmlType::Q8_0: {
      const BlockQ8_0* b = reinterpret_cast<const BlockQ8_0*>(row) + c / 32;
      return (float)b->qs[c % 32] * h2f(b->d);
    }
    default: {  // Q4_0
      const BlockQ4_0* b = reinterpret_cast<const BlockQ4_0*>(row) + c / 32;
      const int j = c % 32;
      const int q = j < 16 ? (b->qs[j] & 15) : (b->qs[j - 16] >> 4);
      return (float)(q - 8) * h2f(b->d);
    }
  }
}

__global__ void embed_rows_kernel(const void* table, GgmlType type, size_t row_bytes, int vocab,
                                  int dim, const int* tokens, float* x, int ldx) {
  detail::pdl_wait();  // x may still be read by the previous chunk's last kernel
  detail::pdl_trigger();
  const int i = blockIdx.x, tok = tokens[i];
  const bool ok = tok >= 0 && tok < vocab;
  for (int c = threadIdx.x; c < dim; c += blockDim.x)
    x[(size_t)i * ldx + c] = ok ? table_value(table, type, row_bytes, tok, c) : NAN;
}

// (value, index) is better than (bv, bi): larger, or equal with a lower index; NaN never wins.
__device__ __forceinline__ bool better(float v, int i, float bv, int bi) {
  if (isnan(v)) return false;
  if (isnan(bv)) return true;
  return v > bv || (v == bv && i < bi);
}

__global__ void __launch_bounds__(1024)
    argmax_rows_kernel(const float* logits, int ld, int n, int* out) {
  detail::pdl_wait();  // logits come from the lm_head GEMM
  detail::pdl_trigger();
  const float* row = logits + (size_t)blockIdx.x * ld;
  float bv = NAN;
  int bi = 0x7fffffff;
  for (int c = threadIdx.x; c < n; c += blockDim.x) {
    const float v = row[c];
    if (better(v, c, bv, bi)) bv = v, bi = c;
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, off);
    const int oi = __shfl_xor_sync(0xffffffffu, bi, off);
    if (better(ov, oi, bv, bi)) bv = ov, bi = oi;
  }
  __shared__ float sv[32];
  __shared__ int si[32];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) sv[warp] = bv, si[warp] = bi;
  __syncthreads();
  if (warp == 0) {
    const int nw = blockDim.x >> 5;
    bv = lane < nw ? sv[lane] : NAN;
    bi = lane < nw ? si[lane] : 0x7fffffff;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, off);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, off);
      if (better(ov, oi, bv, bi)) bv = ov, bi = oi;
    }
    if (lane == 0) out[blockIdx.x] = isnan(bv) ? 0 : bi;
  }
}

}  // namespace

void embed_rows(const void* table, GgmlType type, int vocab, int dim, const int* tokens, int n,
                float* x, int ldx, cudaStream_t s) {
  const TypeInfo* ti = type_info(type);
  if (!ti || (type != GgmlType::F32 && type != GgmlType::F16 && type != GgmlType::BF16 &&
              type != GgmlType::Q4_0 && type != GgmlType::Q8_0))
    fail("embed_rows: token_embd type ", type_name(type), " is not supported");
  if (dim % ti->block_size != 0) fail("embed_rows: dim=", dim, " not a multiple of the block");
  if (n <= 0 || ldx < dim || !table || !tokens || !x) fail("embed_rows: bad arguments n=", n);
  detail::launch_pdl(embed_rows_kernel, dim3(n), dim3(256), s, table, type, row_bytes(*ti, dim),
                     vocab, dim, tokens, x, ldx);
}

void argmax_rows(const float* logits, int ld, int n_cols, int n_rows, int* out, cudaStream_t s) {
  if (n_rows <= 0 || n_cols <= 0 || ld < n_cols || !logits || !out)
    fail("argmax_rows: bad arguments rows=", n_rows, " cols=", n_cols);
  detail::launch_pdl(argmax_rows_kernel, dim3(n_rows), dim3(1024), s, logits, ld, n_cols, out);
}

}  // namespace smolrt::cuda
