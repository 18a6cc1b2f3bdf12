// Repacking: each unit (block or super-block) of each of a panel's 16 rows is decoded into plain
// quants q (0..2^bits-1, the source block's own bits, nothing rounded) and its scales, then written
// as layout.h's quads and planes. Scales are copied as stored (fp16 d, d_min, m; the K-quants'
// 6-bit scale/min pairs unpacked to bytes), so a kernel computes with exactly the source values.
#include "backend/cpu/fast/pack.h"

#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "core/parallel_for.h"
#include "quant/formats.h"

namespace smolrt::cpu::fast {

namespace {

// One row's unit, decoded.
struct Unit {
  uint8_t q[kQKK];      // quants in weight order (32 or 256 used)
  uint16_t d = 0;       // fp16 scale (every format)
  uint16_t m = 0;       // fp16 min (Q4_1/Q5_1) or dmin (Q4_K/Q5_K)
  uint8_t sc[16] = {};  // K-quants: 6-bit scales (Q4_K/Q5_K: 8) or Q6_K's int8 scales (16)
  uint8_t mn[8] = {};   // Q4_K/Q5_K: 6-bit mins
};

template <typename B>
B block_at(const uint8_t* row, int64_t u) {
  B b;
  std::memcpy(&b, row + u * int64_t(sizeof(B)), sizeof b);
  return b;
}

// The scale and 5-bit quants of a Q5_0/Q5_1 block, as dequant_block_q5_0 reads them.
template <typename B>
void decode_q5(const B& b, Unit& o) {
  o.d = b.d;
  const uint32_t qh = load_qh(b.qh);
  for (int j = 0; j < 16; ++j) {
    o.q[j] = static_cast<uint8_t>((b.qs[j] & 0x0f) | (((qh >> j) << 4) & 0x10));
    o.q[j + 16] = static_cast<uint8_t>((b.qs[j] >> 4) | ((qh >> (j + 12)) & 0x10));
  }
}

void decode(PackFmt f, const uint8_t* row, int64_t u, Unit& o) {
  switch (f) {
    case kQ4_0:
    case kQ4_1: {
      const uint8_t* p = row + u * (f == kQ4_0 ? 18 : 20);
      std::memcpy(&o.d, p, 2);
      if (f == kQ4_1) std::memcpy(&o.m, p + 2, 2);
      const uint8_t* qs = p + (f == kQ4_0 ? 2 : 4);
      for (int j = 0; j < 16; ++j) {
        o.q[j] = qs[j] & 0x0f;
        o.q[j + 16] = qs[j] >> 4;
      }
      return;
    }
    case kQ5_0:
      return decode_q5(block_at<BlockQ5_0>(row, u), o);
    case kQ5_1:
      o.m = block_at<BlockQ5_1>(row, u).m;
      return decode_q5(block_at<BlockQ5_1>(row, u), o);
    case kQ8_0: {
      const BlockQ8_0 b = block_at<BlockQ8_0>(row, u);
      o.d = b.d;
      for (int j = 0; j < 32; ++j) o.q[j] = static_cast<uint8_t>(b.qs[j] ^ 0x80);
      return;
    }
    case kQ4_K:
    case kQ5_K: {
      const uint8_t* scales;
      const uint8_t* qs;
      const uint8_t* qh = nullptr;
      BlockQ4_K b4;
      BlockQ5_K b5;
      if (f == kQ4_K) {
        b4 = block_at<BlockQ4_K>(row, u);
        o.d = b4.d, o.m = b4.dmin, scales = b4.scales, qs = b4.qs;
      } else {
        b5 = block_at<BlockQ5_K>(row, u);
        o.d = b5.d, o.m = b5.dmin, scales = b5.scales, qs = b5.qs, qh = b5.qh;
      }
      for (int j = 0; j < 8; ++j) {
        int sc, m;
        k_scale_min(j, scales, sc, m);
        o.sc[j] = static_cast<uint8_t>(sc);
        o.mn[j] = static_cast<uint8_t>(m);
        const uint8_t* q = qs + 32 * (j / 2);
        const int shift = (j & 1) * 4;
        for (int l = 0; l < 32; ++l) {
          o.q[32 * j + l] =
              static_cast<uint8_t>(((q[l] >> shift) & 0x0f) + (qh ? ((qh[l] >> j) & 1) << 4 : 0));
        }
      }
      return;
    }
    case kQ6_K: {
      const BlockQ6_K b = block_at<BlockQ6_K>(row, u);
      o.d = b.d;
      std::memcpy(o.sc, b.scales, 16);
      for (int h = 0; h < 2; ++h) {
        const uint8_t* ql = b.ql + 64 * h;
        const uint8_t* qh = b.qh + 32 * h;
        uint8_t* y = o.q + 128 * h;
        for (int l = 0; l < 32; ++l) {
          y[l] = static_cast<uint8_t>((ql[l] & 0x0f) | ((qh[l] & 3) << 4));
          y[l + 32] = static_cast<uint8_t>((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4));
          y[l + 64] = static_cast<uint8_t>((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));
          y[l + 96] = static_cast<uint8_t>((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4));
        }
      }
      return;
    }
    default:
      fail("internal: no panel format ", int(f));
  }
}

// Writes sub-block s of the panel's decoded units (quants q[r][32 s ..]) as layout.h's planes.
void write_quants(int bits, const Unit* units, int s, uint8_t* dst) {
  auto q = [&](int r, int k) { return units[r].q[32 * s + k]; };
  if (bits == 8) {
    for (int k = 0; k < 8; ++k)
      for (int r = 0; r < kPanel; ++r)
        for (int i = 0; i < 4; ++i) dst[64 * k + 4 * r + i] = q(r, 4 * k + i);
    return;
  }
  for (int c = 0; c < 4; ++c)
    for (int r = 0; r < kPanel; ++r)
      for (int i = 0; i < 4; ++i)
        dst[64 * c + 4 * r + i] =
            static_cast<uint8_t>((q(r, 4 * c + i) & 0x0f) | ((q(r, 4 * c + 16 + i) & 0x0f) << 4));
  for (int r = 0; r < kPanel; ++r) {
    for (int i = 0; i < 4; ++i) {
      uint8_t a = 0, b = 0;
      for (int c = 0; c < 4; ++c) {
        const int lo = q(r, 4 * c + i) >> 4, hi = q(r, 4 * c + 16 + i) >> 4;
        if (bits == 5) {
          a = static_cast<uint8_t>(a | (lo << c) | (hi << (c + 4)));
        } else if (bits == 6) {
          a = static_cast<uint8_t>(a | (lo << (2 * c)));
          b = static_cast<uint8_t>(b | (hi << (2 * c)));
        }
      }
      if (bits >= 5) dst[256 + 4 * r + i] = a;
      if (bits == 6) dst[320 + 4 * r + i] = b;
    }
  }
}

void write_scales(PackFmt f, const Unit* units, uint8_t* dst) {
  uint16_t* h = reinterpret_cast<uint16_t*>(dst);  // 64-byte aligned panel, even offsets
  for (int r = 0; r < kPanel; ++r) h[r] = units[r].d;
  if (f == kQ4_1 || f == kQ5_1 || f == kQ4_K || f == kQ5_K) {
    for (int r = 0; r < kPanel; ++r) h[kPanel + r] = units[r].m;
  }
  if (f == kQ4_K || f == kQ5_K) {
    for (int j = 0; j < 8; ++j) {
      for (int r = 0; r < kPanel; ++r) {
        dst[64 + 16 * j + r] = units[r].sc[j];
        dst[192 + 16 * j + r] = units[r].mn[j];
      }
    }
  } else if (f == kQ6_K) {
    for (int j = 0; j < 16; ++j)
      for (int r = 0; r < kPanel; ++r) dst[32 + 16 * j + r] = units[r].sc[j];
  }
}

}  // namespace

int pack_fmt(GgmlType t) {
  constexpr GgmlType kTypes[kPackFmts] = {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0,
                                          GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::Q4_K,
                                          GgmlType::Q5_K, GgmlType::Q6_K};  // PackFmt order
  for (int f = 0; f < kPackFmts; ++f) {
    if (kTypes[f] == t) return f;
  }
  return -1;
}

int float_fmt(GgmlType t) {
  constexpr GgmlType kTypes[kFloatFmts] = {GgmlType::F32, GgmlType::F16, GgmlType::BF16};
  for (int f = 0; f < kFloatFmts; ++f) {
    if (kTypes[f] == t) return f;
  }
  return -1;
}

void PackedWeight::Free::operator()(uint8_t* p) const {
  std::free(p);
}

PackedWeight::PackedWeight(const TensorView& w) : rows_(w.rows) {
  const int f = pack_fmt(w.type);
  if (f < 0) fail("internal: tensor '", w.name, "' of type ", type_name(w.type), " is not packed");
  fmt_ = static_cast<PackFmt>(f);
  const PackInfo& pi = kPackInfo[fmt_];
  const int64_t unit_cols = int64_t(32) * pi.subs;
  if (w.cols % unit_cols != 0) {
    fail("tensor '", w.name, "' has ", w.cols, " columns, not a multiple of the ",
         type_name(w.type), " block size ", unit_cols);
  }
  units_ = w.cols / unit_cols;
  panels_ = (w.rows + kPanel - 1) / kPanel;
  const int64_t qbytes = units_ * pi.subs * pi.sub_bytes;
  panel_bytes_ = (qbytes + units_ * pi.scale_bytes + 63) / 64 * 64;
  const size_t total = static_cast<size_t>(panels_ * panel_bytes_);
  bytes_.reset(static_cast<uint8_t*>(std::aligned_alloc(64, total)));
  if (!bytes_) fail("out of memory repacking tensor '", w.name, "' (", total, " bytes)");
  std::memset(bytes_.get(), 0, total);
  const uint8_t* src = static_cast<const uint8_t*>(w.data);
  const size_t stride = w.row_stride();
  parallel_for(panels_, 16, [&](int64_t p0, int64_t p1) {
    Unit units[kPanel];
    for (int64_t p = p0; p < p1; ++p) {
      uint8_t* panel = bytes_.get() + p * panel_bytes_;
      for (int64_t u = 0; u < units_; ++u) {
        for (int r = 0; r < kPanel; ++r) {
          const int64_t row = p * kPanel + r;
          units[r] = Unit{};
          if (row < w.rows) decode(fmt_, src + size_t(row) * stride, u, units[r]);
        }
        for (int s = 0; s < pi.subs; ++s)
          write_quants(pi.bits, units, s, panel + (u * pi.subs + s) * pi.sub_bytes);
        write_scales(fmt_, units, panel + qbytes + u * pi.scale_bytes);
      }
    }
  });
}

}  // namespace smolrt::cpu::fast
