// Kernel tests' check that every SIMD path (and on AVX-512 either vendor's
// tuning; with AVX512-BF16, either setting of the bf16 dot products; with
// AMX, either setting of the AMX kernels; with
// AVX512-VBMI, also without the kernels that need it) gives the scalar
// kernels' bits.
#pragma once
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdio>
#include <cstring>
#include <functional>
#include <vector>

#include "kernels/cpu/isa.h"

namespace dsv4::test {

// Runs `product` (which fills an output of `size` floats, first set to -1)
// with the scalar kernels and with every SIMD path this CPU has; all must
// give the same bits. Returns the scalar output.
inline std::vector<float> expect_simd_gives_scalar_bits(size_t size, const std::function<void(float*)>& product) {
  const KernelIsa saved = active_kernel_isa();
  set_kernel_isa(KernelIsa::Scalar);
  std::vector<float> scalar(size, -1.0f);
  product(scalar.data());
  for (KernelIsa isa : {KernelIsa::Avx2, KernelIsa::Avx512}) {
    if (!kernel_isa_supported(isa)) {
      std::printf("skipping %s: not supported by this CPU\n", kernel_isa_name(isa));
      continue;
    }
    set_kernel_isa(isa);
    std::vector<float> simd(size, -1.0f);
    product(simd.data());
    EXPECT_EQ(0, std::memcmp(simd.data(), scalar.data(), size * 4)) << kernel_isa_name(isa);
    if (isa == KernelIsa::Avx512 && bf16_dot_supported()) {  // and with the other bf16 dot setting
      const bool bf16 = bf16_dot_enabled();
      set_bf16_dot(!bf16);
      std::vector<float> other(size, -1.0f);
      product(other.data());
      set_bf16_dot(bf16);
      EXPECT_EQ(0, std::memcmp(other.data(), scalar.data(), size * 4)) << "avx512, bf16 dot " << !bf16;
    }
    if (isa == KernelIsa::Avx512 && amx_supported()) {  // and with the other AMX setting
      const bool amx = amx_enabled();
      set_amx(!amx);
      std::vector<float> other(size, -1.0f);
      product(other.data());
      set_amx(amx);
      EXPECT_EQ(0, std::memcmp(other.data(), scalar.data(), size * 4)) << "avx512, AMX " << !amx;
    }
    if (isa == KernelIsa::Avx512) {  // and with the other vendor's tuning
      const KernelTuning tuning = kernel_tuning();
      const KernelTuning other_tuning = tuning == KernelTuning::Intel ? KernelTuning::Amd : KernelTuning::Intel;
      set_kernel_tuning(other_tuning);
      std::vector<float> other(size, -1.0f);
      product(other.data());
      set_kernel_tuning(tuning);
      EXPECT_EQ(0, std::memcmp(other.data(), scalar.data(), size * 4))
          << "avx512, " << (other_tuning == KernelTuning::Intel ? "Intel" : "AMD") << " tuning";
    }
    if (isa == KernelIsa::Avx512 && avx512_vbmi_supported()) {  // and without the VBMI kernels
      set_avx512_vbmi(false);
      std::vector<float> other(size, -1.0f);
      product(other.data());
      set_avx512_vbmi(true);
      EXPECT_EQ(0, std::memcmp(other.data(), scalar.data(), size * 4)) << "avx512 without the VBMI kernels";
    }
  }
  set_kernel_isa(saved);
  return scalar;
}

}  // namespace dsv4::test
