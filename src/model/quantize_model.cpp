#include "model/quantize_model.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <map>
#include <vector>

#include "core/error.h"
#include "core/parallel_for.h"
#include "quant/format.h"
#include "quant/quantize.h"

namespace smolrt {

namespace {

struct TargetName {
  const char* name;
  GgmlType type;
  QuantMix mix;
  uint32_t ftype;  // llama_ftype
};

// Every format as a single type (format.h), then llama.cpp's mixtures.
const std::vector<TargetName>& targets() {
  static const std::vector<TargetName> t = [] {
    std::vector<TargetName> v;
    for_each_format([&](auto f) {
      using F = decltype(f);
      v.push_back({F::kName, F::kType, QuantMix::None, F::kFileType});
    });
    v.insert(v.end(), {{"q4_k_s", GgmlType::Q4_K, QuantMix::Q4_K_S, 14},
                       {"q4_k_m", GgmlType::Q4_K, QuantMix::Q4_K_M, 15},
                       {"q5_k_s", GgmlType::Q5_K, QuantMix::Q5_K_S, 16},
                       {"q5_k_m", GgmlType::Q5_K, QuantMix::Q5_K_M, 17}});
    return v;
  }();
  return t;
}

const TargetName* find_target(const QuantTarget& t) {
  for (const TargetName& n : targets()) {
    if (n.type == t.type && n.mix == t.mix) return &n;
  }
  return nullptr;
}

std::string target_list() {
  std::string s;
  for (const TargetName& n : targets()) s += cat(s.empty() ? "" : ", ", n.name);
  return s;
}

// llama.cpp's use_more_bits: the first and last eighth of the layers and every third in between.
bool use_more_bits(int i, int n) {
  return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

bool contains(const std::string& s, const char* part) {
  return s.find(part) != std::string::npos;
}

// llama.cpp's tensor_type_fallback for a row of `cols` elements (see the header).
GgmlType fit_row_length(GgmlType t, uint64_t cols, const std::string& name, std::string& note) {
  auto fits = [cols](GgmlType x) {
    return cols % static_cast<uint64_t>(type_info(x)->block_size) == 0;
  };
  if (fits(t)) return t;
  GgmlType to = GgmlType::F16;
  if (t == GgmlType::Q4_K) to = GgmlType::Q5_0;
  if (t == GgmlType::Q5_K) to = GgmlType::Q5_1;
  if (t == GgmlType::Q6_K) to = GgmlType::Q8_0;
  if (!fits(to)) to = GgmlType::F16;
  note = cat(name, ": row length ", cols, " is not a multiple of ", type_info(t)->block_size,
             ", so it cannot be stored as ", type_name(t), "; storing it as ", type_name(to),
             " instead");
  return to;
}

}  // namespace

QuantTarget parse_quant_target(const std::string& s, const std::string& flag) {
  std::string l = s;
  std::transform(l.begin(), l.end(), l.begin(), [](unsigned char c) { return std::tolower(c); });
  for (const TargetName& n : targets()) {
    if (l == n.name) return QuantTarget(n.type, n.mix);
  }
  fail("unknown type '", s, "' for ", flag, "; use one of ", target_list());
}

std::string target_name(const QuantTarget& t) {
  const TargetName* n = find_target(t);
  return n ? n->name : type_name(t.type);
}

uint32_t llama_file_type(const QuantTarget& t) {
  const TargetName* n = find_target(t);
  if (!n) fail("no llama.cpp file type for target ", type_name(t.type));
  return n->ftype;
}

std::vector<TensorPlan> plan_model(const std::vector<TensorShape>& tensors, const QuantTarget& t) {
  if (!find_target(t) || !is_convertible(t.type)) fail("cannot quantize to ", type_name(t.type));
  // llama.cpp's counters number the attn_v-like tensors (n = how many) and the ffn_down tensors
  // (n = the layer count, one per layer for llama) in the order its loader keeps weights in:
  // by the layer number of "blk.N." (other tensors first), then by name; not the file order.
  std::vector<size_t> order(tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  auto layer_of = [](const std::string& name) {
    int layer = -1;
    if (std::sscanf(name.c_str(), "blk.%d.", &layer) != 1) layer = -1;
    return layer;
  };
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const int la = layer_of(tensors[a].name), lb = layer_of(tensors[b].name);
    return la != lb ? la < lb : tensors[a].name < tensors[b].name;
  });
  std::vector<int> rank(tensors.size(), 0);
  int n_attn_v = 0, n_ffn_down = 0;
  bool tied = true;
  for (size_t i : order) {
    const std::string& name = tensors[i].name;
    if (contains(name, "attn_v.weight") || contains(name, "attn_qkv.weight")) rank[i] = n_attn_v++;
    if (contains(name, "ffn_down")) rank[i] = n_ffn_down++;
    if (name == "output.weight") tied = false;
  }
  const bool four_bit = t.type == GgmlType::Q4_0 || t.type == GgmlType::Q4_1;
  const bool quantized = type_info(t.type)->block_size > 1;
  std::vector<TensorPlan> plan;
  plan.reserve(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorShape& s = tensors[i];
    TensorPlan p{t.type, ""};
    const bool matrix = s.n_dims >= 2 && s.ne[1] > 1;
    if (!matrix) {
      p.type = GgmlType::F32;
      plan.push_back(p);
      continue;
    }
    const bool output = s.name == "output.weight";
    const bool embd = s.name == "token_embd.weight";
    const bool attn_v = contains(s.name, "attn_v.weight") || contains(s.name, "attn_qkv.weight");
    const bool ffn_down = contains(s.name, "ffn_down");
    if (four_bit) {
      if (embd || output) p.type = GgmlType::Q8_0;
    } else if (quantized && t.type != GgmlType::Q8_0 && (output || (tied && embd))) {
      p.type = s.ne[0] % kQKK == 0 ? GgmlType::Q6_K : GgmlType::Q8_0;
    } else if (attn_v) {
      if ((t.mix == QuantMix::Q4_K_M || t.mix == QuantMix::Q5_K_M) &&
          use_more_bits(rank[i], n_attn_v)) {
        p.type = GgmlType::Q6_K;
      } else if (t.mix == QuantMix::Q4_K_S && rank[i] < 4) {
        p.type = GgmlType::Q5_K;
      }
    } else if (ffn_down) {
      if ((t.mix == QuantMix::Q4_K_M || t.mix == QuantMix::Q5_K_M) &&
          use_more_bits(rank[i], n_ffn_down)) {
        p.type = GgmlType::Q6_K;
      } else if (t.mix == QuantMix::Q4_K_S && rank[i] < n_ffn_down / 8) {
        p.type = GgmlType::Q5_K;
      }
    }
    p.type = fit_row_length(p.type, s.ne[0], s.name, p.note);
    plan.push_back(p);
  }
  return plan;
}

QuantizedModel quantize_model(const gguf::File& in, const QuantTarget& target, const LogFn& log) {
  QuantizedModel out;
  const auto& tensors = in.tensors();
  std::vector<TensorShape> shapes;
  for (const gguf::TensorInfo& t : tensors) {
    TensorShape s;
    s.name = t.name;
    std::copy(t.ne, t.ne + 4, s.ne);
    s.n_dims = t.n_dims;
    shapes.push_back(s);
  }
  const std::vector<TensorPlan> plan = plan_model(shapes, target);
  for (const auto& [key, value] : in.metadata()) out.writer.set(key, value);
  out.writer.set("general.file_type", gguf::Value::u32(llama_file_type(target)));

  out.buffers.resize(tensors.size());
  std::map<uint32_t, int> counts;
  const size_t width = std::to_string(tensors.size()).size();
  for (size_t i = 0; i < tensors.size(); ++i) {
    const gguf::TensorInfo& t = tensors[i];
    if (!is_convertible(t.type)) {
      fail(in.path(), ": tensor '", t.name, "' has type ", type_name(t.type),
           ", which smolrt quantize cannot read (supported sources: f32, f16, bf16, q4_0, q4_1, "
           "q5_0, q5_1, q8_0, q4_k, q5_k, q6_k); convert it with llama.cpp's llama-quantize first");
    }
    const GgmlType dst = plan[i].type;
    if (!plan[i].note.empty()) {
      out.fallbacks.push_back({t.name, dst});
      if (log) log("note: " + plan[i].note);
    }
    ++counts[static_cast<uint32_t>(dst)];
    const uint64_t cols = t.ne[0];
    const uint64_t rows = cols ? t.n_elements() / cols : 0;
    const TypeInfo& si = *type_info(t.type);
    const TypeInfo& di = *type_info(dst);
    const size_t src_row = row_bytes(si, cols), dst_row = row_bytes(di, cols);
    std::vector<uint8_t>& buf = out.buffers[i];
    buf.resize(dst_row * rows);
    if (log) {
      char line[256];
      std::snprintf(line, sizeof line, "[%*zu/%zu] %-28s %-5s -> %-5s %llu x %llu", (int)width,
                    i + 1, tensors.size(), t.name.c_str(), si.name, di.name,
                    (unsigned long long)cols, (unsigned long long)rows);
      log(line);
    }
    if (t.type == dst) {
      std::copy(t.data, t.data + buf.size(), buf.data());
    } else {
      parallel_for(static_cast<int64_t>(rows), 16, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          try {
            convert_row(t.type, t.data + r * src_row, dst, buf.data() + r * dst_row,
                        static_cast<int64_t>(cols));
          } catch (const Error& e) {
            fail(in.path(), ": tensor '", t.name, "' row ", r, ": ", e.what());
          }
        }
      });
    }
    std::vector<uint64_t> ne(t.ne, t.ne + t.n_dims);
    out.writer.add_tensor(t.name, std::move(ne), dst, buf.data(), buf.size());
    out.n_params += t.n_elements();
    out.tensor_bytes += buf.size();
  }
  for (const auto& [id, n] : counts) out.type_counts.emplace_back(static_cast<GgmlType>(id), n);
  out.n_tensors = tensors.size();
  return out;
}

}  // namespace smolrt
