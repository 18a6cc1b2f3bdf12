#include "model/quantize_model.h"

#include <algorithm>
#include <cctype>
#include <cstdio>

#include "core/error.h"
#include "core/parallel_for.h"
#include "quant/quantize.h"

namespace smolrt {

GgmlType parse_target_type(const std::string& s, const std::string& flag) {
  std::string l = s;
  std::transform(l.begin(), l.end(), l.begin(), [](unsigned char c) { return std::tolower(c); });
  if (l == "q4_0") return GgmlType::Q4_0;
  if (l == "q4_1") return GgmlType::Q4_1;
  if (l == "q8_0") return GgmlType::Q8_0;
  if (l == "f16") return GgmlType::F16;
  if (l == "bf16") return GgmlType::BF16;
  if (l == "f32") return GgmlType::F32;
  fail("unknown type '", s, "' for ", flag, "; use one of q4_0, q4_1, q8_0, f16, bf16, f32");
}

uint32_t llama_file_type(GgmlType target) {
  switch (target) {
    case GgmlType::F32:
      return 0;
    case GgmlType::F16:
      return 1;
    case GgmlType::Q4_0:
      return 2;
    case GgmlType::Q4_1:
      return 3;
    case GgmlType::Q8_0:
      return 7;
    case GgmlType::BF16:
      return 32;
    default:
      break;
  }
  fail("no llama.cpp file type for target ", type_name(target));
}

GgmlType plan_tensor_type(const std::string& name, const uint64_t ne[4], uint32_t n_dims,
                          GgmlType target, std::string* note) {
  if (note) note->clear();
  const bool matrix = n_dims >= 2 && ne[1] > 1;
  if (!matrix) return GgmlType::F32;
  GgmlType t = target;
  if ((target == GgmlType::Q4_0 || target == GgmlType::Q4_1) &&
      (name == "token_embd.weight" || name == "output.weight")) {
    t = GgmlType::Q8_0;
  }
  const TypeInfo& ti = *type_info(t);
  if (ne[0] % static_cast<uint64_t>(ti.block_size) != 0) {
    if (note) {
      *note = cat(name, ": row length ", ne[0], " is not a multiple of ", ti.block_size,
                  ", so it cannot be stored as ", ti.name, "; storing it as f16 instead");
    }
    return GgmlType::F16;
  }
  return t;
}

QuantizedModel quantize_model(const gguf::File& in, GgmlType target, const LogFn& log) {
  if (!is_convertible(target)) fail("cannot quantize to ", type_name(target));
  QuantizedModel out;
  for (const auto& [key, value] : in.metadata()) out.writer.set(key, value);
  out.writer.set("general.file_type", gguf::Value::u32(llama_file_type(target)));

  const auto& tensors = in.tensors();
  out.buffers.resize(tensors.size());
  const size_t width = std::to_string(tensors.size()).size();
  for (size_t i = 0; i < tensors.size(); ++i) {
    const gguf::TensorInfo& t = tensors[i];
    if (!is_convertible(t.type)) {
      fail(in.path(), ": tensor '", t.name, "' has type ", type_name(t.type),
           ", which smolrt quantize cannot read (supported sources: f32, f16, bf16, q4_0, q4_1, "
           "q8_0); convert it with llama.cpp's llama-quantize first");
    }
    std::string note;
    const GgmlType dst = plan_tensor_type(t.name, t.ne, t.n_dims, target, &note);
    if (!note.empty()) {
      out.fallbacks.push_back(t.name);
      if (log) log("note: " + note);
    }
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
  out.n_tensors = tensors.size();
  return out;
}

}  // namespace smolrt
