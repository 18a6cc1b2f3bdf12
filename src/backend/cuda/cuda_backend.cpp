// The CUDA backend: session buffers, the decode step (enqueue_step), CUDA-graph capture/replay
// and the Backend interface. Kernels live in src/cuda/.
#include "backend/cuda/cuda_backend.h"

#include <algorithm>
#include <limits>
#include <string>

#include "backend/cpu/sample.h"
#include "backend/cuda/cuda_prefill.h"
#include "backend/cuda/decode_layer.h"
#include "backend/cuda/device_weights.h"
#include "backend/kv_pages.h"
#include "core/cuda_check.h"
#include "core/env.h"
#include "core/error.h"
#include "cuda/argmax.h"
#include "cuda/attention_decode.h"
#include "cuda/device_buffer.h"
#include "cuda/embed.h"
#include "cuda/gemv.h"
#include "cuda/gemv_head.h"
#include "cuda/launch.h"
#include "cuda/rmsnorm.h"
#include "cuda/sample.h"

namespace smolrt {
namespace {

// Device scratch of one session, carved from one allocation (sizes from the config and n_ctx).
struct Scratch {
  // [2] token, pos: written by an H2D copy before a step, or by the previous step's argmax stage 2
  // (id, pos + 1)
  int* params;
  float* x;          // [dim] residual stream
  float* xb;         // [dim] normalized x (debug path); else the residual stream's second buffer
  float* q;          // [q_dim]
  float* k;          // [kv_dim] (debug path: raw K before RoPE)
  float* v;          // [kv_dim] (debug path)
  float* att;        // [q_dim] attention output
  float* hb;         // [hidden_dim] act(gate)*up
  float* tmp;        // [dim] a projection before its post norm (gemma3)
  float* logits;     // [vocab]
  float* kv;         // [n_layers][2][n_ctx][kv_dim] fp32
  float* attn_part;  // [n_heads][max_splits][head_dim+2]
  int* attn_count;   // [n_heads]
  float* amax_v;     // [max(kArgmaxBlocks, kGemvMaxBlocks)] argmax partials
  int* amax_i;       // [max(kArgmaxBlocks, kGemvMaxBlocks)]
  int* amax_out;     // [1]
  int* sample_hist;  // [n_ctx] penalty window for the GPU sampler
  int* sample_out;   // [1] sampled id (-1: candidate set too large, sample on the host)
};

// kv_floats: the KV caches of all layers (per layer 2 x its rows x kv_dim).
void carve(cuda::Carver& c, Scratch& s, const ModelConfig& cfg, int n_ctx, size_t kv_floats) {
  s.params = c.take<int>(2);
  s.x = c.take<float>(cfg.dim);
  s.xb = c.take<float>(cfg.dim);
  s.q = c.take<float>(cfg.q_dim());
  s.k = c.take<float>(cfg.kv_dim());
  s.v = c.take<float>(cfg.kv_dim());
  s.att = c.take<float>(cfg.q_dim());
  s.hb = c.take<float>(cfg.hidden_dim);
  s.tmp = c.take<float>(cfg.dim);
  s.logits = c.take<float>(cfg.vocab_size);
  s.kv = c.take<float>(kv_floats);
  s.attn_part = c.take<float>((size_t)cfg.n_heads * cuda::attn_splits(n_ctx, cfg.head_dim) *
                              (cfg.head_dim + 2));
  s.attn_count = c.take<int>(cfg.n_heads);
  constexpr int parts =
      cuda::kArgmaxBlocks > cuda::kGemvMaxBlocks ? cuda::kArgmaxBlocks : cuda::kGemvMaxBlocks;
  static_assert(cuda::kGemvMaxBlocks <= cuda::kArgmaxMaxParts);
  s.amax_v = c.take<float>(parts);
  s.amax_i = c.take<int>(parts);
  s.amax_out = c.take<int>(1);
  s.sample_hist = c.take<int>(n_ctx);
  s.sample_out = c.take<int>(1);
}

class CudaBackend final : public CudaBackendApi {
 public:
  CudaBackend(const Model& m, const BackendOptions& opt, const CudaOptions& copt)
      : cfg_(m.config), copt_(copt) {
    n_ctx_ = opt.n_ctx > 0 ? opt.n_ctx : cfg_.n_ctx_train;
    if (n_ctx_ <= 0) fail("the model has no context length; pass --ctx N");
    if (cfg_.n_ctx_train > 0 && n_ctx_ > cfg_.n_ctx_train) {
      fail("--ctx ", n_ctx_, " exceeds the model's training context of ", cfg_.n_ctx_train,
           " tokens; pass --ctx ", cfg_.n_ctx_train, " or less");
    }
    const int hd = cfg_.head_dim;
    if (hd < 4 || hd > 256 || hd % 4 != 0 || 256 % hd != 0) {
      fail("head_dim ", hd,
           " has no CUDA attention kernel (supported 4..256, powers of two); use "
           "--backend cpu");
    }
    if (cfg_.n_heads % cfg_.n_kv_heads != 0) {
      fail("n_heads ", cfg_.n_heads, " is not a multiple of n_kv_heads ", cfg_.n_kv_heads);
    }
    w_ = cuda::upload_weights(m.weights, cfg_);
    if (opt.f16_weights) dense_ = cuda::make_dense(w_, cfg_);

    // A sliding-window layer's KV cache is a ring (kv_pages.h's rule for steps of a prefill
    // chunk), when that is smaller than the context: gemma3-270m at 32,768 tokens keeps 1,023
    // rows in 15 of its 18 layers. Prompts then prefill in chunks of at most ring_chunk_ tokens.
    ring_chunk_ = copt_.prefill_chunk;
    size_t kv_floats = 0;
    for (int l = 0; l < cfg_.n_layers; ++l) {
      const int64_t ring = sliding_ring_rows(cfg_.sliding_window, ring_chunk_);
      ring_.push_back(cfg_.is_swa(l) && cfg_.sliding_window > 0 && ring < n_ctx_ ? (int)ring : 0);
      kv_off_.push_back(kv_floats);
      kv_floats += 2 * (size_t)(ring_[l] > 0 ? ring_[l] : n_ctx_) * cfg_.kv_dim();
    }
    if (std::none_of(ring_.begin(), ring_.end(), [](int r) { return r > 0; })) {
      ring_chunk_ = std::numeric_limits<int>::max();  // no ring: chunks and rollbacks unbounded
    }
    cuda::Carver sizer;
    carve(sizer, s_, cfg_, n_ctx_, kv_floats);
    scratch_ = cuda::DeviceBuffer(sizer.used(), "activations, KV cache and scratch");
    cuda::Carver placer(static_cast<char*>(scratch_.get()));
    carve(placer, s_, cfg_, n_ctx_, kv_floats);
    // Poison everything once (NaN bytes) so a kernel reading unwritten scratch shows up in tests;
    // the attention split counters must start at zero.
    CUDA_CHECK(cudaMemset(scratch_.get(), 0xff, scratch_.size()));
    CUDA_CHECK(cudaMemset(s_.attn_count, 0, sizeof(int) * cfg_.n_heads));
    std::vector<void*> kc, vc;
    for (int l = 0; l < cfg_.n_layers; ++l) kc.push_back(kcache(l)), vc.push_back(vcache(l));
    prefill_ =
        cuda::CudaPrefill::create(m, w_, kc, vc, ring_, n_ctx_,
                                  opt.f16_weights ? &dense_ : nullptr);  // nullptr: per token

    // [0..1] token/pos staging, [2] 4-byte readbacks, [3] id stored by the argmax kernel.
    // [4]: the id of the odd-parity step graph (speculative steps alternate, see speculate).
    params_host_ = cuda::PinnedBuffer(5 * sizeof(int), "step parameters");
    CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&id_dev_),
                                        static_cast<int*>(params_host_.get()) + 3, 0));
    logits_host_ = cuda::PinnedBuffer(sizeof(float) * cfg_.vocab_size, "logits readback");
    hist_host_ = cuda::PinnedBuffer(sizeof(int) * n_ctx_, "sampling history");
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    if (prefill_) prefill_->set_dense_rows(opt.dense_rows, prefill_chunk(), kernels());
    debug_ = env_flag("SMOLRT_DEBUG_ACTIVATIONS", false);
    for (cudaEvent_t& e : step_done_) {
      CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    }
  }

  ~CudaBackend() override {
    if (stream_) cudaStreamSynchronize(stream_);  // a speculative step may still run
    drop_graph();
    for (cudaEvent_t e : step_done_) {
      if (e) cudaEventDestroy(e);
    }
    if (stream_) cudaStreamDestroy(stream_);
  }

  std::string name() const override { return "cuda"; }
  const ModelConfig& config() const override { return cfg_; }
  int n_ctx() const override { return n_ctx_; }
  int position() const override { return pos_; }
  void reset() override {
    // A queued speculative step would otherwise run ahead of the next prompt's prefill (stream
    // order) and delay its first token: let it finish here, where nothing waits on it.
    if (spec_) CUDA_CHECK(cudaStreamSynchronize(stream_));
    discard_spec();
    pos_ = 0;
  }
  void rollback(int pos) override {
    discard_spec();
    if (pos < 0 || pos > pos_) {
      fail("rollback to position ", pos, " is invalid: the KV cache holds ", pos_, " tokens");
    }
    check_ring_back(pos);
    pos_ = pos;
  }

  std::span<const float> forward_token(int token, int pos) override {
    step(token, pos);
    CUDA_CHECK(cudaMemcpyAsync(logits_host_.get(), s_.logits, sizeof(float) * cfg_.vocab_size,
                               cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    return {static_cast<const float*>(logits_host_.get()), (size_t)cfg_.vocab_size};
  }

  int forward_token_greedy(int token, int pos) override {
    int par = 0;
    if (spec_ && token == spec_token_ && pos == spec_pos_) {
      // The step for (token, pos) was launched speculatively by the previous call: adopt it.
      check_token(token);
      check_pos(pos);
      par = spec_par_;
      spec_ = false;
      pos_ = pos + 1;
    } else {
      discard_spec();
      step(token, pos, 0);
      CUDA_CHECK(cudaEventRecord(step_done_[0], stream_));
    }
    // Speculation: the next greedy step reads its token and position from the device slots this
    // step's argmax fills, so it is launched now, before the host has the id: the host's wake-up
    // and launch latency overlap the GPU. Its id goes to the other host slot (parity). If the
    // caller then asks for anything else, the speculative step is discarded (discard_spec).
    const bool spec = copt_.speculate && !debug_ && pos + 1 < n_ctx_;
    if (spec) {
      const int np = 1 - par;
      launch(np);
      CUDA_CHECK(cudaEventRecord(step_done_[np], stream_));
      spec_ = true;
      spec_par_ = np;
      spec_pos_ = pos + 1;
    }
    // The argmax kernel stored the id in pinned host memory: one event wait, no copy.
    CUDA_CHECK(cudaEventSynchronize(step_done_[par]));
    const int id =
        *reinterpret_cast<volatile const int*>(static_cast<int*>(params_host_.get()) + 3 + par);
    spec_token_ = id;
    slots_known_ = !spec;  // with a speculative step queued the slots move on to (id', pos + 2)
    slot_token_ = id;
    slot_pos_ = pos + 1;
    return id;
  }

  // Sampling on the GPU (cuda::sample): one 4-byte readback instead of the logits. The host
  // path (logits readback + cpu::sample) covers what the kernel declines: candidate sets over
  // 1024 tokens (top-k off with min-p off), vocabularies past its shared memory, penalty windows
  // longer than the context.
  int forward_token_sample(int token, int pos, const SamplingParams& p, float u,
                           std::span<const int> history) override {
    step(token, pos);
    return sample_last(p, u, history);
  }
  int forward_prompt_sample(std::span<const int> tokens, const SamplingParams& p, float u,
                            std::span<const int> history) override {
    if (tokens.empty()) fail("forward_prompt: the prompt is empty; give at least one token");
    if (batched(tokens)) {
      prefill_->run_last(tokens, pos_, prefill_chunk(), prefill_out(), kernels(), copt_.use_graph);
      pos_ += (int)tokens.size();
      return sample_last(p, u, history);  // logits stay on the GPU
    }
    forward_prompt(tokens);
    return sample_last(p, u, history);
  }

  // Prompts: batched prefill (cuda_prefill.h) continuing at position(), logits of the last token
  // left in s_.logits like a decode step; otherwise one decode step
  // per token (models the prefill kernels do not take, debug activations, option off).
  std::span<const float> forward_prompt(std::span<const int> tokens) override {
    if (tokens.empty()) fail("forward_prompt: the prompt is empty; give at least one token");
    if (batched(tokens)) {
      cuda::PrefillLastOut out = prefill_out();
      out.host_logits = static_cast<float*>(logits_host_.get());
      prefill_->run_last(tokens, pos_, prefill_chunk(), out, kernels(), copt_.use_graph);
      pos_ += (int)tokens.size();
      CUDA_CHECK(cudaStreamSynchronize(stream_));
      return {static_cast<const float*>(logits_host_.get()), (size_t)cfg_.vocab_size};
    }
    std::span<const float> out;
    for (int t : tokens) out = forward_token(t, pos_);
    return out;
  }

  std::vector<float> forward_prompt_all(std::span<const int> tokens) override {
    if (tokens.empty()) fail("forward_prompt_all: the prompt is empty; give at least one token");
    if (batched(tokens)) {
      std::vector<float> all = prefill_->run_all(tokens, pos_, prefill_chunk(), kernels());
      pos_ += (int)tokens.size();
      return all;
    }
    std::vector<float> all;
    all.reserve(tokens.size() * cfg_.vocab_size);
    for (int t : tokens) {
      std::span<const float> l = forward_token(t, pos_);
      all.insert(all.end(), l.begin(), l.end());
    }
    return all;
  }

  std::vector<Activation> activations() const override { return acts_; }

  // Samples from s_.logits (the last step's) on stream_.
  int sample_last(const SamplingParams& p, float u, std::span<const int> history) {
    const std::span<const int> w = cpu::penalty_window(history, p);
    const int vocab = cfg_.vocab_size;
    if (vocab <= cuda::sample_max_vocab() && w.size() <= static_cast<size_t>(n_ctx_)) {
      int* hh = static_cast<int*>(hist_host_.get());
      for (size_t i = 0; i < w.size(); ++i) {
        check_token(w[i]);  // the kernel trusts its ids
        hh[i] = w[i];
      }
      if (!w.empty()) {
        CUDA_CHECK(cudaMemcpyAsync(s_.sample_hist, hh, sizeof(int) * w.size(),
                                   cudaMemcpyHostToDevice, stream_));
      }
      cuda::sample(s_.logits, vocab, p, u, s_.sample_hist, static_cast<int>(w.size()),
                   s_.sample_out, kernels());
      int* out = static_cast<int*>(params_host_.get()) + 2;
      CUDA_CHECK(cudaMemcpyAsync(out, s_.sample_out, sizeof(int), cudaMemcpyDeviceToHost, stream_));
      CUDA_CHECK(cudaStreamSynchronize(stream_));
      if (*out >= 0) return *out;
    }
    CUDA_CHECK(cudaMemcpyAsync(logits_host_.get(), s_.logits, sizeof(float) * vocab,
                               cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    return cpu::sample({static_cast<const float*>(logits_host_.get()), static_cast<size_t>(vocab)},
                       p, u, history, host_sample_scratch_);
  }

  std::string device_name() const override {
    int dev = 0;
    cudaDeviceProp prop;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess) {
      return "cuda";
    }
    return prop.name;
  }

  // A 1 GiB device-to-device cudaMemcpy, best of 5 after a warm-up, counting read + write bytes.
  double copy_bandwidth_gbs() override {
    if (copy_gbs_ > 0) return copy_gbs_;
    const size_t n = size_t{1} << 30;
    cuda::DeviceBuffer a(n, "bandwidth probe"), b(n, "bandwidth probe");
    CUDA_CHECK(cudaMemset(a.get(), 1, n));
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    float best = 1e30f;
    for (int i = 0; i < 6; ++i) {
      CUDA_CHECK(cudaEventRecord(e0, stream_));
      CUDA_CHECK(cudaMemcpyAsync(b.get(), a.get(), n, cudaMemcpyDeviceToDevice, stream_));
      CUDA_CHECK(cudaEventRecord(e1, stream_));
      CUDA_CHECK(cudaEventSynchronize(e1));
      float ms = 0;
      CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
      if (i > 0 && ms < best) best = ms;
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    copy_gbs_ = 2.0 * n / (best * 1e-3) / 1e9;
    return copy_gbs_;
  }

  void set_options(const CudaOptions& o) override {
    discard_spec();
    CUDA_CHECK(cudaStreamSynchronize(stream_));  // no graph in flight while it is destroyed
    copt_ = o;
    drop_graph();
    if (prefill_) prefill_->drop_graphs();  // they baked in the old options' launches
  }
  const CudaOptions& options() const override { return copt_; }
  CudaStats stats() const override {
    CudaStats st;
    st.upload_ms = w_.upload_ms;
    st.weight_bytes = w_.bytes;
    st.scratch_bytes = scratch_.size();
    st.kernels_per_step = kernels_per_step_;
    st.batched_prefill = prefill_ != nullptr;
    if (prefill_) {
      st.prefill_graph_captures = prefill_->graph_captures();
      st.prefill_graph_launches = prefill_->graph_launches();
    }
    return st;
  }

 private:
  cuda::PrefillLastOut prefill_out() const { return {s_.logits, nullptr}; }

  // True when these tokens go through the batched prefill; then also checks every id and that
  // they fit the context, before anything runs (so a bad prompt leaves the cache untouched).
  bool batched(std::span<const int> tokens) {
    discard_spec();
    if (!prefill_ || debug_ || !copt_.batched_prefill) return false;
    if (copt_.prefill_chunk < 1) {
      fail("prefill chunk size ", copt_.prefill_chunk,
           " must be at least 1 (CudaOptions::prefill_chunk)");
    }
    for (int t : tokens) check_token(t);
    if ((size_t)pos_ + tokens.size() > (size_t)n_ctx_) {
      fail("the prompt of ", tokens.size(), " tokens at position ", pos_,
           " does not fit the context of ", n_ctx_, " tokens; pass a larger --ctx (at most ",
           cfg_.n_ctx_train, ") or a shorter prompt");
    }
    return true;
  }

  // Layer l's caches: n_ctx rows, or ring_[l] rows (position p at row p % ring_[l]).
  float* kcache(int l) const { return s_.kv + kv_off_[l]; }
  float* vcache(int l) const {
    return kcache(l) + (size_t)(ring_[l] > 0 ? ring_[l] : n_ctx_) * cfg_.kv_dim();
  }
  // Going back to `pos` (rollback, or a step at an earlier position) keeps the window of every
  // ring cache only up to sliding_ring_back(window + chunk - 1, window) = ring_chunk_ positions
  // back (kv_pages.h): the ring rows before were overwritten.
  void check_ring_back(int pos) const {
    if (pos >= pos_ - ring_chunk_) return;
    fail("going back from position ", pos_, " to ", pos,
         " is beyond the sliding-window layers' KV rings (at most ", ring_chunk_,
         " positions back, the prefill chunk); go back less, or reset and feed the text again");
  }
  // Prefill chunks never exceed the chunk the rings were sized for.
  int prefill_chunk() const { return std::min(copt_.prefill_chunk, ring_chunk_); }

  void drop_graph() {
    for (int i = 0; i < 2; ++i) {
      if (exec_[i]) cudaGraphExecDestroy(exec_[i]);
      if (graph_[i]) cudaGraphDestroy(graph_[i]);
      exec_[i] = nullptr;
      graph_[i] = nullptr;
    }
    kernels_per_step_ = 0;
  }

  // Forgets a queued speculative step: it still runs (stream order, before anything launched
  // later), but everything it writes is rewritten before it is read again (its KV row at
  // spec_pos_ by the next step at that position, the scratch by any step); only the device
  // token/pos slots it advanced are unknown now, so the next step copies them from the host.
  void discard_spec() {
    if (!spec_) return;
    spec_ = false;
    slots_known_ = false;
  }

  // Launches one decode step for (token, pos). The device slots are written by an H2D copy unless
  // they already hold exactly (token, pos): the previous greedy step's argmax left them so. Any
  // other step leaves the token slot unknown to the host (slots_known_ = false).
  void step(int token, int pos, int par = 0) {
    discard_spec();
    check_token(token);
    check_pos(pos);
    check_ring_back(pos);
    const bool on_device = slots_known_ && token == slot_token_ && pos == slot_pos_;
    slots_known_ = false;
    if (!on_device) {
      int* hp = static_cast<int*>(params_host_.get());
      CUDA_CHECK(cudaStreamSynchronize(stream_));  // the pinned params are free to overwrite
      hp[0] = token;
      hp[1] = pos;
      CUDA_CHECK(cudaMemcpyAsync(s_.params, hp, 2 * sizeof(int), cudaMemcpyHostToDevice, stream_));
    }
    launch(par);
    pos_ = pos + 1;
  }

  // How this backend's kernels are launched (its stream and options).
  cuda::Launch kernels() const { return {stream_, copt_.pdl, copt_.split_k}; }

  // Enqueues one decode step reading token/pos from the device slots; par selects the host slot
  // its argmax stores the id in (params_host_[3 + par]) and the graph that does so.
  void launch(int par) {
    par_ = par;
    if (debug_) {
      acts_.clear();
      enqueue_step(true);
    } else if (copt_.use_graph) {
      if (!exec_[par]) capture(par);
      CUDA_CHECK(cudaGraphLaunch(exec_[par], stream_));
    } else {
      enqueue_step(false);
    }
  }

  void capture(int par) {
    CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    try {
      enqueue_step(false);
    } catch (...) {
      cudaGraph_t g = nullptr;
      cudaStreamEndCapture(stream_, &g);
      if (g) cudaGraphDestroy(g);
      throw;
    }
    CUDA_CHECK(cudaStreamEndCapture(stream_, &graph_[par]));
    CUDA_CHECK(cudaGraphInstantiate(&exec_[par], graph_[par], 0));
    size_t n = 0;
    CUDA_CHECK(cudaGraphGetNodes(graph_[par], nullptr, &n));
    kernels_per_step_ = (int)n;  // every captured node is a kernel launch
  }

  // Debug: copy a device vector into the named activation list (synchronous; plain launches).
  void record(const std::string& name, const float* dev, int n) {
    Activation a;
    a.name = name;
    a.values.resize(n);
    CUDA_CHECK(
        cudaMemcpyAsync(a.values.data(), dev, sizeof(float) * n, cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    acts_.push_back(std::move(a));
  }

  // Every kernel of one decode step, in stream order. debug: separate RMSNorm kernels, raw
  // Q/K/V and the separate RoPE kernel, with readbacks of every named activation.
  void enqueue_step(bool debug, unsigned mask = kAllParts) {
    if (debug) mask = kAllParts;
    const cuda::Launch st = kernels();
    const float eps = cfg_.norm_eps;
    const int* pos = s_.params + 1;
    if (mask & kEmbed)
      cuda::embed(w_.token_embd, s_.params, 1, s_.x, cfg_.dim, st, cfg_.embed_scale);
    if (debug) record("embed", s_.x, cfg_.dim);
    // The residual stream: s_.x, and s_.xb as its second buffer where post norms are made in the
    // next matvec's staging (not in debug, which reads x back after every layer).
    cuda::DecodeResidual res(cfg_, s_.x, s_.xb, s_.tmp, /*fuse=*/!debug);
    // The matvec input: x with its RMSNorm weight (the kernels normalize their staged copy) and
    // any pending residual update, or in debug x normalized by the separate kernel into xb and
    // recorded. Called right before the matvec it feeds.
    auto norm_in = [&](const float* nw, const std::string& name, const float*& x, const float*& n,
                       cuda::ResidualIn& ri) {
      if (!debug) {
        ri = res.take(&x);
        n = nw;
        return;
      }
      cuda::rmsnorm(s_.xb, res.x(), nw, cfg_.dim, eps, st);
      record(name, s_.xb, cfg_.dim);
      x = s_.xb;
      n = nullptr;
    };
    for (int l = 0; l < cfg_.n_layers; ++l) {
      const cuda::DevLayer& L = w_.layers[l];
      const std::string blk = "blk." + std::to_string(l) + ".";
      if (mask & kQkv) {
        const float *qx = nullptr, *qn = nullptr;
        cuda::ResidualIn ri;
        norm_in(L.attn_norm, blk + "attn_norm", qx, qn, ri);
        cuda::step_qkv(cfg_, w_, l, qx, qn, pos, nullptr, s_.q, s_.k, s_.v, kcache(l), vcache(l),
                       st, ring_[l], false, ri);
      }
      if (mask & kAttn)
        cuda::attention_decode(s_.att, s_.q, kcache(l), vcache(l), pos, n_ctx_, cfg_.n_heads,
                               cfg_.n_kv_heads, cfg_.head_dim, {s_.attn_part, s_.attn_count}, st,
                               {}, cfg_.is_swa(l) ? cfg_.sliding_window : 0, cfg_.attn_scale,
                               ring_[l]);
      if (mask & kWo) res.add(L.wo, s_.att, L.post_attn_norm, st);
      if (debug) record(blk + "attn_out", res.x(), cfg_.dim);
      if (mask & kGateUp) {
        const float *x = nullptr, *n = nullptr;
        cuda::ResidualIn ri;
        norm_in(L.ffn_norm, blk + "ffn_norm", x, n, ri);
        cuda::gemv_gate_up(L.w_gate, L.w_up, x, n, eps, s_.hb, st, static_cast<int>(cfg_.act), ri);
      }
      if (mask & kDown) res.add(L.w_down, s_.hb, L.post_ffn_norm, st);
      if (debug) record(blk + "ffn_out", res.x(), cfg_.dim);
    }
    // Hand-off to the next step: token/pos slots and the pinned id. Not in the profiling graphs,
    // which replay one position.
    int* np = advance_ ? s_.params : nullptr;
    int* ho = advance_ ? id_dev_ + par_ : nullptr;
    res.flush(st);
    if (mask & kHead) {
      const float *x = nullptr, *n = nullptr;
      cuda::ResidualIn none;  // flushed: nothing pending
      norm_in(w_.output_norm, "output_norm", x, n, none);
      cuda::gemv_argmax(w_.output, x, n, eps, s_.logits, s_.amax_v, s_.amax_i, st);
    }
    if (debug) record("logits", s_.logits, cfg_.vocab_size);
    if (mask & kArgmax) {
      // The next step's token slot, params[0]; its position, params[1], advances.
      cuda::argmax_final(s_.amax_v, s_.amax_i, cuda::gemv_argmax_parts(w_.output), s_.amax_out, st,
                         {np, np, np ? 2u : 0u}, ho);
    }
  }

  // Time graphs holding only one kind of kernel (all layers' worth), replayed `reps` times.
  std::vector<std::pair<std::string, double>> profile_parts(int reps) override {
    if (pos_ == 0) fail("profile_parts: run at least one token first");
    const std::pair<const char*, unsigned> parts[] = {{"embed", kEmbed},
                                                      {"norm+qkv+rope+kv", kQkv},
                                                      {"attention", kAttn},
                                                      {"wo+residual", kWo},
                                                      {"norm+gate_up+silu", kGateUp},
                                                      {"down+residual", kDown},
                                                      {"norm+lm_head", kHead},
                                                      {"argmax", kArgmax},
                                                      {"all", kAllParts},
                                                      // What one kind costs inside the full
                                                      // chain: all minus all-but-that-kind.
                                                      {"all-qkv", kAllParts & ~kQkv},
                                                      {"all-attention", kAllParts & ~kAttn},
                                                      {"all-wo", kAllParts & ~kWo},
                                                      {"all-gate_up", kAllParts & ~kGateUp},
                                                      {"all-down", kAllParts & ~kDown},
                                                      {"all-head", kAllParts & ~kHead}};
    int* hp = static_cast<int*>(params_host_.get());
    discard_spec();
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    slots_known_ = false;
    hp[0] = 1;
    hp[1] = pos_ - 1;
    CUDA_CHECK(cudaMemcpyAsync(s_.params, hp, 2 * sizeof(int), cudaMemcpyHostToDevice, stream_));
    std::vector<std::pair<std::string, double>> out;
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    for (const auto& [name, bits] : parts) {
      cudaGraph_t g = nullptr;
      cudaGraphExec_t ex = nullptr;
      CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
      advance_ = false;
      try {
        enqueue_step(false, bits);
      } catch (...) {
        advance_ = true;
        cudaStreamEndCapture(stream_, &g);
        if (g) cudaGraphDestroy(g);
        throw;
      }
      advance_ = true;
      CUDA_CHECK(cudaStreamEndCapture(stream_, &g));
      CUDA_CHECK(cudaGraphInstantiate(&ex, g, 0));
      for (int i = 0; i < 3; ++i) CUDA_CHECK(cudaGraphLaunch(ex, stream_));
      CUDA_CHECK(cudaEventRecord(e0, stream_));
      for (int i = 0; i < reps; ++i) CUDA_CHECK(cudaGraphLaunch(ex, stream_));
      CUDA_CHECK(cudaEventRecord(e1, stream_));
      CUDA_CHECK(cudaEventSynchronize(e1));
      float ms = 0;
      CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
      out.emplace_back(name, 1000.0 * ms / reps);
      cudaGraphExecDestroy(ex);
      cudaGraphDestroy(g);
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return out;
  }

  enum : unsigned {
    kEmbed = 1,
    kQkv = 2,
    kAttn = 4,
    kWo = 8,
    kGateUp = 16,
    kDown = 32,
    kHead = 64,
    kArgmax = 128,
    kAllParts = 255
  };

  ModelConfig cfg_;
  CudaOptions copt_;
  int n_ctx_ = 0;
  std::vector<int> ring_;       // per layer: ring rows of a sliding-window layer's cache, or 0
  std::vector<size_t> kv_off_;  // per layer: float offset of its K cache in s_.kv (V follows)
  int ring_chunk_ = 0;          // the prefill chunk the rings were sized with
  int pos_ = 0;
  cuda::DeviceWeights w_;
  cuda::DenseWeights dense_;  // fp16 copies (BackendOptions::f16_weights), else empty
  cuda::DeviceBuffer scratch_;
  Scratch s_ = {};
  std::unique_ptr<cuda::CudaPrefill> prefill_;  // batched prefill; nullptr: not supported
  cuda::PinnedBuffer params_host_, logits_host_, hist_host_;
  cpu::SampleScratch host_sample_scratch_;
  cudaStream_t stream_ = nullptr;
  cudaGraph_t graph_[2] = {};  // one per host id slot (parity), see launch()
  cudaGraphExec_t exec_[2] = {};
  cudaEvent_t step_done_[2] = {};  // recorded after the step graph of each parity
  int par_ = 0;                    // enqueue_step: host id slot of the step being enqueued
  int kernels_per_step_ = 0;
  double copy_gbs_ = 0;
  int* id_dev_ = nullptr;  // device address of params_host_[3] (the argmax kernel's id store)
  // A speculative greedy step queued for (spec_token_, spec_pos_) (see forward_token_greedy).
  bool spec_ = false;
  int spec_token_ = 0, spec_pos_ = 0, spec_par_ = 0;
  // What the device token/pos slots hold, when the host knows (device_token hand-off).
  bool slots_known_ = false;
  int slot_token_ = 0, slot_pos_ = 0;
  bool advance_ = true;  // enqueue_step: argmax hands off to the next step (off when profiling)
  std::vector<Activation> acts_;
};

}  // namespace

bool cuda_device_available() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return n > 0;
}

std::unique_ptr<CudaBackendApi> make_cuda_backend_ex(const Model& m, const BackendOptions& opt,
                                                     const CudaOptions& copt) {
  if (!cuda_device_available()) {
    fail(
        "the CUDA backend was asked for but no CUDA GPU is visible (cudaGetDeviceCount found "
        "none); use --backend cpu");
  }
  return std::make_unique<CudaBackend>(m, opt, copt);
}

std::unique_ptr<Backend> make_cuda_backend(const Model& m, const BackendOptions& opt) {
  return make_cuda_backend_ex(m, opt, CudaOptions{});
}

}  // namespace smolrt
