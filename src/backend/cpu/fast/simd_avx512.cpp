// AVX-512 (F/BW/VL/DQ) kernels; compiled with that level's -m flags (CMakeLists.txt), called only
// after runtime detection (isa.cpp).
#include "backend/cpu/fast/simd_x86_512.h"

namespace smolrt::cpu::fast {
const SimdTable kSimdAvx512 = make_table();
}  // namespace smolrt::cpu::fast
