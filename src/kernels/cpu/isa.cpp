#include "kernels/cpu/isa.h"

#include <cstdlib>

#include "core/error.h"

namespace dsv4 {

namespace {

KernelIsa detect_best() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512dq"))
    return KernelIsa::Avx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
    return KernelIsa::Avx2;
  return KernelIsa::Scalar;
}

struct Choice {
  KernelIsa isa;
  std::string reason;
};

Choice initial_choice() {
  const KernelIsa best = detect_best();
  const std::string features = best == KernelIsa::Avx512 ? "AVX-512 F/BW/VL/DQ"
                               : best == KernelIsa::Avx2 ? "AVX2+FMA+F16C, no AVX-512"
                                                         : "no AVX2+FMA+F16C";
  const char* env = std::getenv("DSV4_KERNELS");
  if (env && *env) {
    KernelIsa want;
    if (!parse_kernel_isa(env, &want))
      return {best,
              std::string("DSV4_KERNELS=") + env + " is not scalar|avx2|avx512; the CPU's best (" + features + ")"};
    if (int(want) <= int(best)) return {want, std::string("DSV4_KERNELS=") + env + " (CPU has " + features + ")"};
    return {best,
            std::string("DSV4_KERNELS=") + env + " is not supported by this CPU (" + features + "); the CPU's best"};
  }
  return {best, "the CPU's best (" + features + ")"};
}

Choice& choice() {
  static Choice c = initial_choice();
  return c;
}

}  // namespace

KernelIsa best_kernel_isa() {
  static const KernelIsa best = detect_best();
  return best;
}

bool kernel_isa_supported(KernelIsa isa) { return int(isa) <= int(best_kernel_isa()); }

const char* kernel_isa_name(KernelIsa isa) {
  switch (isa) {
    case KernelIsa::Avx512: return "avx512";
    case KernelIsa::Avx2: return "avx2";
    default: return "scalar";
  }
}

bool parse_kernel_isa(const std::string& name, KernelIsa* isa) {
  if (name == "scalar")
    *isa = KernelIsa::Scalar;
  else if (name == "avx2")
    *isa = KernelIsa::Avx2;
  else if (name == "avx512")
    *isa = KernelIsa::Avx512;
  else
    return false;
  return true;
}

KernelIsa active_kernel_isa() { return choice().isa; }

void set_kernel_isa(KernelIsa isa) {
  if (!kernel_isa_supported(isa)) throw Error(std::string("CPU does not support ") + kernel_isa_name(isa));
  choice() = {isa, std::string("set by the program (") + kernel_isa_name(isa) + ")"};
}

std::string kernel_isa_reason() { return choice().reason; }

}  // namespace dsv4
