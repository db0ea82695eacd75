#include "kernels/cpu/isa.h"

#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "core/error.h"
#include "core/machine.h"

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


namespace {

// Multiply-adds per second of 24 independent chains of `Instr` for about a
// millisecond: what the core issues of it. The loops below are unrolled so
// that the 24 accumulators stay in registers: rolled, GCC kept them in
// memory, and every chain then waited on a store and a load per step, which
// hid the instructions' own rates (docs/kernels.md, "Where it runs").
template <class Instr>
double chain_rate(const Instr& instr, int macs_per_instr) {
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t rounds = instr();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return double(rounds) * 24 * macs_per_instr / s;
}

constexpr int64_t kCalibrationRounds = 20000;

DSV4_TARGET_AVX512 int64_t fma_chains() {
  __m512 a[24];
  for (auto& v : a) v = _mm512_setzero_ps();
  __m512 w = _mm512_set1_ps(1e-3f), x = _mm512_set1_ps(1e-3f);
  for (int64_t r = 0; r < kCalibrationRounds; ++r) {
#pragma GCC unroll 24
    for (auto& v : a) v = _mm512_fmadd_ps(w, x, v);
    asm volatile("" : "+v"(w), "+v"(x));
  }
  float sink = 0;
  for (auto& v : a) sink += _mm512_reduce_add_ps(v);
  asm volatile("" ::"x"(sink));
  return kCalibrationRounds;
}

DSV4_TARGET_AVX512_BF16 int64_t bf16_chains() {
  __m512 a[24];
  for (auto& v : a) v = _mm512_setzero_ps();
  __m512i w = _mm512_set1_epi32(0x3a833a83), x = _mm512_set1_epi32(0x3a833a83);
  for (int64_t r = 0; r < kCalibrationRounds; ++r) {
#pragma GCC unroll 24
    for (auto& v : a) v = _mm512_dpbf16_ps(v, (__m512bh)w, (__m512bh)x);
    asm volatile("" : "+v"(w), "+v"(x));
  }
  float sink = 0;
  for (auto& v : a) sink += _mm512_reduce_add_ps(v);
  asm volatile("" ::"x"(sink));
  return kCalibrationRounds;
}

struct Bf16Choice {
  bool on = false;
  std::string why;
};

// On where the CPU has AVX512-BF16 and VDPBF16PS does at least 1.3x the
// multiply-adds of fp32 FMAs on this core (the AMX Xeon of docs/kernels.md
// issues it once per two cycles: 0.5x), unless DSV4_BF16_DOT says otherwise
// (0 / 1). The choice changes speed only, never bits.
Bf16Choice initial_bf16_choice() {
  if (!bf16_dot_supported()) return {false, ""};
  const char* env = std::getenv("DSV4_BF16_DOT");
  if (env && std::string(env) == "0") return {false, "AVX512-BF16 dot products off (DSV4_BF16_DOT=0)"};
  if (env && std::string(env) == "1") return {true, "AVX512-BF16 dot products for FP8-rounded inputs (DSV4_BF16_DOT=1)"};
  double fma = 0, bf16 = 0;
  for (int i = 0; i < 3; ++i) {  // best of three: a descheduled moment only lowers one
    fma = std::max(fma, chain_rate(fma_chains, 16));
    bf16 = std::max(bf16, chain_rate(bf16_chains, 32));
  }
  char ratio[96];
  std::snprintf(ratio, sizeof ratio, "VDPBF16PS measured at %.2fx the multiply-adds of fp32 FMAs", bf16 / fma);
  if (bf16 >= 1.3 * fma) return {true, std::string("AVX512-BF16 dot products for FP8-rounded inputs (") + ratio + ")"};
  return {false, std::string("AVX512-BF16 dot products off (") + ratio + ")"};
}

Bf16Choice& bf16_choice() {
  static Bf16Choice c = initial_bf16_choice();
  return c;
}

struct TuningChoice {
  KernelTuning tuning = KernelTuning::Amd;
  std::string why;
};

// What each tuning changes, for the startup log.
constexpr const char* kIntelTuning = "Intel tuning: BF16 rows against 2-4 tokens as four streams";
constexpr const char* kAmdTuning = "AMD tuning: BF16 rows against 2-6 tokens eight at a time";

TuningChoice initial_tuning() {
  const char* env = std::getenv("DSV4_KERNEL_TUNING");
  if (env && std::string(env) == "intel")
    return {KernelTuning::Intel, std::string(kIntelTuning) + " (DSV4_KERNEL_TUNING)"};
  if (env && std::string(env) == "amd") return {KernelTuning::Amd, std::string(kAmdTuning) + " (DSV4_KERNEL_TUNING)"};
  __builtin_cpu_init();
  if (__builtin_cpu_is("intel")) return {KernelTuning::Intel, std::string(kIntelTuning) + " (an Intel CPU)"};
  return {KernelTuning::Amd, std::string(kAmdTuning) + (__builtin_cpu_is("amd") ? " (an AMD CPU)" : " (not Intel)")};
}

TuningChoice& tuning_choice() {
  static TuningChoice c = initial_tuning();
  return c;
}

struct AmxChoice {
  bool on = false;
  std::string why;
};

constexpr const char* kAmxOn = "AMX tiles for FP8/FP4 products with FP8-rounded inputs from 16 tokens";

AmxChoice initial_amx_choice() {
  if (!amx_supported()) return {false, ""};
  const char* env = std::getenv("DSV4_AMX");
  if (env && std::string(env) == "0") return {false, "AMX off (DSV4_AMX=0)"};
  return {true, kAmxOn};
}

AmxChoice& amx_choice() {
  static AmxChoice c = initial_amx_choice();
  return c;
}

}  // namespace

bool amx_supported() {
  static const bool supported = [] {
    if (best_kernel_isa() != KernelIsa::Avx512) return false;
    const CpuFeatures f = detect_cpu_features();
    if (!f.amx_tile || !f.amx_bf16 || !avx512_vbmi_supported()) return false;  // (every AMX CPU has VBMI)
    // Linux hands out the tile data state only on request, once per
    // process (arch_prctl ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA).
    constexpr int kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return supported;
}
bool amx_enabled() { return amx_choice().on; }
void set_amx(bool on) {
  AmxChoice& c = amx_choice();
  c.on = on && amx_supported();
  c.why = c.on ? std::string(kAmxOn) + " (set by the program)" : "AMX off (set by the program)";
}

std::string kernel_isa_reason() {
  std::string reason = choice().reason;
  if (choice().isa == KernelIsa::Avx512 && !bf16_choice().why.empty()) reason += "; " + bf16_choice().why;
  if (choice().isa == KernelIsa::Avx512 && !amx_choice().why.empty()) reason += "; " + amx_choice().why;
  if (choice().isa == KernelIsa::Avx512) reason += "; " + tuning_choice().why;
  return reason;
}

KernelTuning kernel_tuning() { return tuning_choice().tuning; }
void set_kernel_tuning(KernelTuning tuning) {
  TuningChoice& c = tuning_choice();
  c.tuning = tuning;
  c.why = std::string(tuning == KernelTuning::Intel ? kIntelTuning : kAmdTuning) + " (set by the program)";
}

bool bf16_dot_supported() {
  static const bool supported = [] {
    __builtin_cpu_init();
    return best_kernel_isa() == KernelIsa::Avx512 && __builtin_cpu_supports("avx512bf16");
  }();
  return supported;
}
bool bf16_dot_enabled() { return bf16_choice().on; }
bool avx512_vbmi_supported() {
  static const bool supported = [] {
    __builtin_cpu_init();
    return best_kernel_isa() == KernelIsa::Avx512 && __builtin_cpu_supports("avx512vbmi");
  }();
  return supported;
}
namespace {
bool& vbmi_on() {
  static bool on = avx512_vbmi_supported();
  return on;
}
}  // namespace
bool avx512_vbmi_enabled() { return vbmi_on(); }
void set_avx512_vbmi(bool on) { vbmi_on() = on && avx512_vbmi_supported(); }
void set_bf16_dot(bool on) {
  Bf16Choice& c = bf16_choice();
  c.on = on && bf16_dot_supported();
  c.why = c.on ? "AVX512-BF16 dot products (set by the program)" : "AVX512-BF16 dot products off (set by the program)";
}

}  // namespace dsv4
