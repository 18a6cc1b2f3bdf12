// The oracle's kernels (ops.h) behind the Kernels interface: each call is exactly the code the
// forward pass ran before the interface existed, so the oracle's results are unchanged bit for bit.
#include <vector>

#include "backend/cpu/kernels.h"
#include "backend/cpu/ops.h"

namespace smolrt::cpu {

namespace {

class RefKernels final : public Kernels {
 public:
  RefKernels(int n_threads, int max_pos) : scratch_(static_cast<size_t>(max_pos)) {
    n_threads_ = n_threads;
  }

  std::string name() const override { return "fp32 reference"; }

  WeightId add(const TensorView& w) override {
    check_computable(w);
    w_.push_back(w);
    return static_cast<WeightId>(w_.size() - 1);
  }

  void matmul(const float* x, int n, std::span<const MatTarget> targets) override {
    for (const MatTarget& t : targets) cpu::gemm(t.out, w_[size_t(t.w)], x, n, n_threads_);
  }

  void attention(float* out, const float* q, const float* k_pool, const float* v_pool,
                 std::span<const AttnRow> rows, const AttnShape& s) override {
    const size_t q_dim = size_t(s.n_heads) * s.head_dim;
    for (size_t j = 0; j < rows.size(); ++j) {
      attention_paged(out + j * q_dim, q + j * q_dim, k_pool, v_pool, rows[j].pages, s.page_size,
                      rows[j].n_pos, s.n_heads, s.n_kv_heads, s.head_dim, scratch_.data(),
                      rows[j].first, s.scale);
    }
  }

  void gated_act(FfnAct act, float* gate, const float* up, int64_t n) override {
    if (act == FfnAct::GeluTanh) {
      gelu_tanh_mul(gate, gate, up, static_cast<int>(n));
    } else {
      silu_mul(gate, gate, up, static_cast<int>(n));
    }
  }

 private:
  std::vector<TensorView> w_;
  std::vector<float> scratch_;  // [max_pos] attention scores, one row at a time
};

}  // namespace

std::unique_ptr<Kernels> make_ref_kernels(int n_threads, int max_pos) {
  return std::make_unique<RefKernels>(n_threads, max_pos);
}

}  // namespace smolrt::cpu
