#include "backend/cpu/fast/isa.h"

#if defined(SMOLRT_HAVE_X86_KERNELS)
#include <cpuid.h>
#endif

#include "core/env.h"
#include "core/error.h"

namespace smolrt::cpu {

namespace {
constexpr Isa kAll[] = {Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Avx512Vnni};
}  // namespace

const char* isa_name(Isa isa) {
  constexpr const char* kNames[] = {"scalar", "avx2", "avx512", "avx512vnni"};  // Isa order
  return kNames[static_cast<int>(isa)];
}

bool isa_supported(Isa isa) {
  if (isa == Isa::Scalar) return true;
#if defined(SMOLRT_HAVE_X86_KERNELS)
  // libgcc's cpu model also checks XCR0, so an OS that does not save the AVX-512 state reads as
  // not supporting it.
  __builtin_cpu_init();
  // F16C from cpuid itself: clang's __builtin_cpu_supports has no "f16c" (the fuzz build is clang).
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0;
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c &&
                    __builtin_cpu_supports("bmi2");
  const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") &&
                      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
                      __builtin_cpu_supports("avx512dq");
  switch (isa) {
    case Isa::Avx2:
      return avx2;
    case Isa::Avx512:
      return avx512;
    case Isa::Avx512Vnni:
      return avx512 && __builtin_cpu_supports("avx512vnni");
    default:
      return false;
  }
#else
  return false;
#endif
}

std::vector<Isa> supported_isas() {
  std::vector<Isa> out;
  for (Isa i : kAll) {
    if (isa_supported(i)) out.push_back(i);
  }
  return out;
}

Isa parse_isa(const std::string& name, const char* what) {
  for (Isa i : kAll) {
    if (name == isa_name(i)) return i;
  }
  fail(what, " '", name, "' is not a CPU kernel level; use scalar, avx2, avx512 or avx512vnni");
}

Isa choose_isa() {
  const std::string forced = env_string("SMOLRT_CPU_ISA");
  if (!forced.empty()) {
    const Isa i = parse_isa(forced, "SMOLRT_CPU_ISA");
    if (!isa_supported(i)) {
      fail("SMOLRT_CPU_ISA=", forced, " but this CPU or build cannot run ", isa_name(i),
           " kernels; unset it or pick one of the supported levels");
    }
    return i;
  }
  return supported_isas().back();
}

}  // namespace smolrt::cpu
