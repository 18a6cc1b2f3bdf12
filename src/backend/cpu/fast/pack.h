// Repacking a quantized weight at load into the fast kernels' panel layout (layout.h).
#pragma once

#include <cstdint>
#include <memory>

#include "backend/cpu/fast/layout.h"
#include "model/model.h"

namespace smolrt::cpu::fast {

// The panel format of a GGUF type, or -1 for a type the fast path computes in float (F32, F16,
// BF16) or not at all.
int pack_fmt(GgmlType t);
// The float format of F32 / F16 / BF16, else -1.
int float_fmt(GgmlType t);

// A weight in the panel layout, owning its 64-byte-aligned bytes.
class PackedWeight {
 public:
  // Repacks w (pack_fmt(w.type) >= 0, cols a multiple of the block size), spreading the panels
  // over a few threads; the bytes are a pure function of w.
  explicit PackedWeight(const TensorView& w);

  PackFmt fmt() const { return fmt_; }
  int64_t panels() const { return panels_; }
  PackedView view() const { return PackedView{bytes_.get(), panel_bytes_, units_, rows_}; }

 private:
  struct Free {
    void operator()(uint8_t* p) const;
  };
  PackFmt fmt_;
  int64_t rows_ = 0;
  int64_t units_ = 0;
  int64_t panels_ = 0;
  int64_t panel_bytes_ = 0;
  std::unique_ptr<uint8_t[], Free> bytes_;
};

}  // namespace smolrt::cpu::fast
