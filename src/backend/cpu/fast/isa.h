// The SIMD levels the fast CPU kernels are built for, and which one this CPU runs. Each level's
// kernels live in their own translation unit compiled with that level's flags (simd_<level>.cpp);
// the default build stays portable and picks the best level the CPU and OS support at startup.
#pragma once

#include <string>
#include <vector>

namespace smolrt::cpu {

enum class Isa {
  Scalar,      // portable C++: every CPU
  Avx2,        // x86-64 AVX2 + FMA + F16C (Haswell, Zen 1 and later)
  Avx512,      // + AVX-512 F/BW/VL/DQ (Skylake-X): u8 x s8 dots through vpmaddubsw
  Avx512Vnni,  // + AVX-512 VNNI (Ice Lake, Sapphire Rapids, Zen 4): vpdpbusd
};

const char* isa_name(Isa isa);  // "scalar" | "avx2" | "avx512" | "avx512vnni"

// Whether this build has the level's kernels and this CPU (and OS) can run them.
bool isa_supported(Isa isa);

// Every supported level, scalar first.
std::vector<Isa> supported_isas();

// The level to run: SMOLRT_CPU_ISA when set (an Error naming the variable when it is unknown or
// this CPU cannot run it), else the best supported one.
Isa choose_isa();

// "avx2" -> Isa::Avx2; an Error naming `what` (the flag or variable) and the choices otherwise.
Isa parse_isa(const std::string& name, const char* what);

}  // namespace smolrt::cpu
