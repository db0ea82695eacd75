// The instruction sets the CPU kernels are written for, how one is chosen,
// and the one place that spells their GCC target attributes.
//
// Every path gives the scalar path's bits (see kernels/linear.h), so the
// choice changes speed only. It is made once at start from the CPU's
// features, unless DSV4_KERNELS=scalar|avx2|avx512 asks for another
// supported one (tests and benchmarks compare paths that way).
#pragma once
#include <string>

// Functions that use AVX2 (+FMA, F16C for the fp16 conversions of e4m3).
#define DSV4_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
// Functions that use AVX-512 (F, BW, VL, DQ: the set the kernels check for).
#define DSV4_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
// AVX-512 plus AVX512-BF16 (VDPBF16PS).
#define DSV4_TARGET_AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))
// AVX512-BF16 plus AVX512-VBMI (byte permutes across a register: the FP8
// one-token kernel's table decoding, see kernels/cpu/linear_fp8_pairs.cpp).
#define DSV4_TARGET_AVX512_BF16_VBMI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx512vbmi")))
// AVX-512 plus AVX512-VBMI without AVX512-BF16 (the fp32 FP8 eight-row
// kernel's table decoding, kernels/cpu/fp8_byte_tables.h).
#define DSV4_TARGET_AVX512_VBMI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vbmi")))
// AVX-512 with AVX512-VBMI plus AMX tiles and their bf16 dot product
// (kernels/cpu/linear_amx.cpp).
#define DSV4_TARGET_AMX __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vbmi,amx-tile,amx-bf16")))

namespace dsv4 {

enum class KernelIsa { Scalar, Avx2, Avx512 };

// The best path this CPU supports.
KernelIsa best_kernel_isa();
bool kernel_isa_supported(KernelIsa isa);
const char* kernel_isa_name(KernelIsa isa);
// Parses "scalar" | "avx2" | "avx512"; false if the name is none of them.
bool parse_kernel_isa(const std::string& name, KernelIsa* isa);

// The path of this process: chosen at start (see above), changed by
// set_kernel_isa (tests).
KernelIsa active_kernel_isa();
void set_kernel_isa(KernelIsa isa);  // must be supported by the CPU
// Why the active path was chosen, in words, for the startup log: the CPU's
// best, or DSV4_KERNELS (and what happened to a request the CPU cannot run).
std::string kernel_isa_reason();

// Whether the AVX-512 packed GEMM may multiply with AVX512-BF16's
// VDPBF16PS where that gives the canonical bits (FP8-rounded inputs times
// FP8/FP4 weights, see kernels/linear.h): twice the multiply-adds per
// instruction of fp32 FMAs. On where the CPU has it and a 1 ms measure at
// first use finds it at least 1.3x the fp32 FMA rate (AMD Zen 4/5: ~2x;
// Sapphire Rapids: ~1x); DSV4_BF16_DOT=0/1 decides instead. Tests switch it
// to compare (same bits either way).
bool bf16_dot_supported();
bool bf16_dot_enabled();
// Whether the CPU also has AVX512-VBMI (Zen 4 and 5, Ice Lake and later;
// not Cooper Lake, the one CPU with AVX512-BF16 without it), and whether
// the VDPBF16PS kernels that decode with its byte permutes (FP8 against 1-4
// tokens, FP4 against 1-7) run: where it is supported, unless tests switch
// them off to compare (the fp32 kernels then take those products, same
// bits).
bool avx512_vbmi_supported();
bool avx512_vbmi_enabled();
// Choices of the AVX-512 register path that were measured to go opposite
// ways on the two CPU families this runs on (docs/kernels.md, "Tuning by
// vendor"), each bit for bit the same as the other:
// - Intel: BF16 rows against 2 to kBf16QuarterMaxTokens tokens go as four
//   streams a quarter of a thread's rows apart (as one token does);
// - AMD (and any other vendor): those BF16 rows go eight consecutive rows
//   at a time.
// (FP8 rows of whole 128-row blocks against 2-4 tokens took their scales in
// a copy of the inputs with the Intel tuning only, until the whole-row
// kernel made that faster on AMD as well; now every CPU does.)
// Measured: an Intel Xeon (Sapphire Rapids class) and AMD Zen 5 and Zen 4.
// DSV4_KERNEL_TUNING=intel|amd decides instead; tests switch it to compare.
enum class KernelTuning { Amd, Intel };
constexpr int kBf16QuarterMaxTokens = 4;
KernelTuning kernel_tuning();
void set_kernel_tuning(KernelTuning tuning);
// Whether the packed GEMM may run FP8 and FP4 products with FP8-rounded
// inputs on AMX tiles (TDPBF16PS, kernels/cpu/linear_amx.cpp): where the
// CPU has AMX-BF16 (and AVX512-VBMI, which every AMX CPU has) and the
// kernel grants the process the tile data state,
// unless DSV4_AMX=0; tests switch it to compare (same bits either way).
bool amx_supported();
bool amx_enabled();
void set_amx(bool on);          // ignored (stays off) where unsupported
void set_bf16_dot(bool on);     // ignored (stays off) where unsupported
void set_avx512_vbmi(bool on);  // ignored (stays off) where unsupported

}  // namespace dsv4
