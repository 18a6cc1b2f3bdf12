// AVX-512 + VNNI kernels; compiled with that level's -m flags (CMakeLists.txt), called only after
// runtime detection (isa.cpp).
#include "backend/cpu/fast/simd_x86_512.h"

namespace smolrt::cpu::fast {
const SimdTable kSimdAvx512Vnni = make_table();
}  // namespace smolrt::cpu::fast
