// The fast path's Kernels: weights repacked at add() (quantized formats) or read in place (F32,
// F16, BF16); a matmul quantizes its inputs once per 32-block (layout.h) and spreads the panels of
// every target over the thread pool; attention is threaded over (row, head). All buffers are sized
// in the constructor: a forward step allocates nothing.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/fast/layout.h"
#include "backend/cpu/fast/pack.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/ops.h"
#include "core/error.h"
#include "core/thread_pool.h"

namespace smolrt::cpu {

namespace {

using fast::kPanel;

const fast::SimdTable& simd_table(Isa isa) {
  switch (isa) {
#if defined(SMOLRT_HAVE_X86_KERNELS)
    case Isa::Avx2:
      return fast::kSimdAvx2;
    case Isa::Avx512:
      return fast::kSimdAvx512;
    case Isa::Avx512Vnni:
      return fast::kSimdAvx512Vnni;
#endif
    case Isa::Scalar:
      return fast::kSimdScalar;
    default:
      fail("internal: no ", isa_name(isa), " kernels in this build");
  }
}

// Tasks per thread: the pool hands them out dynamically, which evens out threads slowed by other
// load on the host.
constexpr int kTasksPerThread = 4;
// Below this many multiply-adds a call runs on the caller alone (waking workers costs more).
constexpr int64_t kMinParallelWork = 1 << 15;

class FastKernels final : public Kernels {
 public:
  FastKernels(int n_threads, Isa isa, int max_rows, int64_t max_cols, int max_pos)
      : isa_(isa),
        t_(simd_table(isa)),
        pool_(shared_thread_pool(n_threads)),
        max_rows_(max_rows),
        max_cols_((max_cols + 31) / 32 * 32),
        max_pos_(max_pos) {
    n_threads_ = pool_.size();
    const size_t rows = size_t(max_rows), blocks = size_t(max_cols_ / 32);
    q_.resize(rows * size_t(max_cols_));
    d_.resize(rows * blocks);
    s_.resize(rows * blocks);
    sum16_.resize(rows * blocks * 2);
    max_tasks_ = n_threads_ * kTasksPerThread;
    tasks_.reserve(size_t(3 * max_tasks_ + 8));
    scores_.resize(size_t(max_tasks_) * size_t(max_pos));
    rows_.resize(scores_.size());
  }

  std::string name() const override { return cat("int8 ", isa_name(isa_)); }

  WeightId add(const TensorView& w) override {
    check_computable(w);
    Weight x;
    x.rows = w.rows;
    x.cols = w.cols;
    if (fast::pack_fmt(w.type) >= 0) {
      x.packed = std::make_unique<fast::PackedWeight>(w);
    } else {
      x.flt = fast::float_fmt(w.type);
      x.fv = fast::FloatView{static_cast<const uint8_t*>(w.data),
                             static_cast<int64_t>(w.row_stride()), w.rows, w.cols};
    }
    if (w.cols > max_cols_)
      fail("internal: tensor '", w.name, "' is wider than the kernels' ", max_cols_);
    w_.push_back(std::move(x));
    return static_cast<WeightId>(w_.size() - 1);
  }

  void matmul(const float* x, int n, std::span<const MatTarget> targets) override;
  void attention(float* out, const float* q, const float* k_pool, const float* v_pool,
                 std::span<const AttnRow> rows, const AttnShape& s) override;
  void gated_act(FfnAct act, float* gate, const float* up, int64_t n) override;

 private:
  struct Weight {
    std::unique_ptr<fast::PackedWeight> packed;  // quantized formats
    int flt = -1;                                // else a FloatFmt
    fast::FloatView fv;
    int64_t rows = 0, cols = 0;
  };
  // Panels [p0, p1) of one target (rows of 16, also for float weights).
  struct Task {
    int target;
    int64_t p0, p1;
  };
  void run_task(const Task& t) const;
  // fn(i) for i < n on the pool, or on the caller alone when work is small.
  template <class Fn>
  void spread(int n, int64_t work, Fn&& fn);

  Isa isa_;
  const fast::SimdTable& t_;
  ThreadPool& pool_;
  int max_rows_;
  int64_t max_cols_;
  int max_pos_;
  int max_tasks_ = 1;
  std::vector<Weight> w_;

  // Quantized inputs of the current matmul (layout.h QActs), [max_rows][max_cols] and per block.
  std::vector<int8_t> q_;
  std::vector<float> d_, s_;
  std::vector<int32_t> sum16_;
  // The current call's state, read by the tasks.
  std::vector<Task> tasks_;
  std::span<const MatTarget> targets_;
  const float* x_ = nullptr;
  int n_ = 0;
  fast::QActs acts_;
  // Attention scratch, [max_tasks][max_pos] each, one slice per task: scores, pool offsets.
  std::vector<float> scores_;
  std::vector<int64_t> rows_;
};

template <class Fn>
void FastKernels::spread(int n, int64_t work, Fn&& fn) {
  if (pool_.size() == 1 || n == 1 || work < kMinParallelWork) {
    for (int i = 0; i < n; ++i) fn(i);
    return;
  }
  pool_.parallel_for(n, fn);
}

void FastKernels::run_task(const Task& t) const {
  const MatTarget& mt = targets_[size_t(t.target)];
  const Weight& w = w_[size_t(mt.w)];
  if (w.packed) {
    t_.gemm[w.packed->fmt()](w.packed->view(), acts_, n_, t.p0, t.p1, mt.out, w.rows);
  } else {
    t_.gemm_float[w.flt](w.fv, x_, w.cols, n_, t.p0 * kPanel, std::min(w.rows, t.p1 * kPanel),
                         mt.out, w.rows);
  }
}

void FastKernels::matmul(const float* x, int n, std::span<const MatTarget> targets) {
  if (targets.empty() || n <= 0) return;
  if (n > max_rows_) fail("internal: a fast matmul of ", n, " rows; at most ", max_rows_);
  const int64_t cols = w_[size_t(targets[0].w)].cols;
  bool any_packed = false;
  int64_t panels = 0;
  for (const MatTarget& mt : targets) {
    const Weight& w = w_[size_t(mt.w)];
    if (w.cols != cols)
      fail("internal: a fast matmul over weights of ", cols, " and ", w.cols, " columns");
    any_packed = any_packed || w.packed;
    panels += (w.rows + kPanel - 1) / kPanel;
  }
  x_ = x;
  n_ = n;
  targets_ = targets;
  if (any_packed) {
    const int64_t blocks = cols / 32;
    acts_ = fast::QActs{q_.data(), cols, d_.data(), s_.data(), sum16_.data(), blocks};
    spread(n, int64_t(n) * cols * 32, [&](int j) {
      t_.quantize(x + size_t(j) * cols, cols, q_.data() + size_t(j) * cols,
                  d_.data() + size_t(j) * blocks, s_.data() + size_t(j) * blocks,
                  sum16_.data() + size_t(j) * blocks * 2);
    });
  }
  // Contiguous panel ranges of about equal size over all targets.
  const int64_t per_task = std::max<int64_t>(1, (panels + max_tasks_ - 1) / max_tasks_);
  tasks_.clear();
  for (size_t i = 0; i < targets.size(); ++i) {
    const int64_t np = (w_[size_t(targets[i].w)].rows + kPanel - 1) / kPanel;
    for (int64_t p = 0; p < np; p += per_task)
      tasks_.push_back(Task{static_cast<int>(i), p, std::min(np, p + per_task)});
  }
  spread(static_cast<int>(tasks_.size()), panels * kPanel * cols * n,
         [this](int i) { run_task(tasks_[size_t(i)]); });
}

void FastKernels::attention(float* out, const float* q, const float* k_pool, const float* v_pool,
                            std::span<const AttnRow> rows, const AttnShape& s) {
  const int hd = s.head_dim, group = s.n_heads / s.n_kv_heads;
  const int64_t q_dim = int64_t(s.n_heads) * hd, kv_dim = int64_t(s.n_kv_heads) * hd;
  const float scale = s.scale != 0.f ? s.scale : 1.0f / std::sqrt(static_cast<float>(hd));
  const int items = static_cast<int>(rows.size()) * s.n_heads;
  const int n_tasks = std::min(items, max_tasks_);
  int64_t work = 0;
  for (const AttnRow& r : rows) {
    if (r.first < 0 || r.first >= r.n_pos || r.n_pos > max_pos_)
      fail("internal: attention over keys ", r.first, "..", r.n_pos - 1);
    work += int64_t(r.n_pos - r.first) * q_dim * 2;
  }
  spread(n_tasks, work, [&](int task) {
    fast::AttnHead h;
    h.stride = kv_dim;
    h.page_size = s.page_size;
    h.head_dim = hd;
    h.scale = scale;
    h.scores = scores_.data() + size_t(task) * size_t(max_pos_);
    h.rows = rows_.data() + size_t(task) * size_t(max_pos_);
    for (int i = items * task / n_tasks; i < items * (task + 1) / n_tasks; ++i) {
      const int j = i / s.n_heads, head = i % s.n_heads;
      const int64_t kv_off = int64_t(head / group) * hd;
      h.out = out + j * q_dim + head * hd;
      h.q = q + j * q_dim + head * hd;
      h.k = k_pool + kv_off;
      h.v = v_pool + kv_off;
      h.pages = rows[size_t(j)].pages;
      h.first = rows[size_t(j)].first;
      h.n_pos = rows[size_t(j)].n_pos;
      t_.attention_head(h);
    }
  });
}

void FastKernels::gated_act(FfnAct act, float* gate, const float* up, int64_t n) {
  const auto fn = act == FfnAct::GeluTanh ? t_.gelu_mul : t_.silu_mul;
  const int n_tasks = static_cast<int>(std::min<int64_t>(max_tasks_, (n + 1023) / 1024));
  spread(n_tasks, n * 16, [&](int task) {
    const int64_t i0 = n * task / n_tasks, i1 = n * (task + 1) / n_tasks;
    fn(gate + i0, up + i0, i1 - i0);  // element-wise: any split gives the same values
  });
}

}  // namespace

std::unique_ptr<Kernels> make_fast_kernels(int n_threads, Isa isa, int max_rows, int64_t max_cols,
                                           int max_pos) {
  if (!isa_supported(isa)) fail("this CPU or build cannot run ", isa_name(isa), " kernels");
  return std::make_unique<FastKernels>(n_threads, isa, max_rows, max_cols, max_pos);
}

}  // namespace smolrt::cpu
