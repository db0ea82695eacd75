// Number formats of the official DeepSeek-V4 checkpoints and the quantization
// round trips that the reference applies to activations (architecture.md §5.3, §6).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

namespace dsv4 {

inline float bits_to_float(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
inline uint32_t float_to_bits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return bits;
}

inline float bf16_to_float(uint16_t v) { return bits_to_float(uint32_t(v) << 16); }

// Lookup tables, filled once at static-initialisation time.
struct NumericTables {
  float e4m3[256];  // F8_E4M3 (e4m3fn) byte -> value
  float e8m0[256];  // F8_E8M0 byte -> 2^(b-127)
  float e2m1[16];   // FP4 nibble -> value
  NumericTables();
};
extern const NumericTables kNumericTables;

inline float e4m3_to_float(uint8_t b) { return kNumericTables.e4m3[b]; }
inline float e8m0_to_float(uint8_t b) { return kNumericTables.e8m0[b]; }
inline float e2m1_to_float(uint8_t nibble) { return kNumericTables.e2m1[nibble & 15]; }

// Smallest power of two >= s, read exactly from the fp32 bits (s > 0, normal).
// This is how ue8m0 scales are formed: exponent + 1 when the mantissa is nonzero.
inline float pow2_ceil(float s) {
  uint32_t bits = float_to_bits(s);
  uint32_t exponent = (bits >> 23) & 0xff;
  if (bits & 0x7fffff) exponent += 1;
  return bits_to_float(exponent << 23);
}

// Round |v| <= 448 to the nearest e4m3 value, ties to even. The grid step
// of |v| is 2^(max(e, -6) - 3) for |v| in [2^e, 2^(e+1)); adding and then
// subtracting 1.5 * 2^23 steps rounds to it in the current (nearest-even)
// mode. Branch-free bit arithmetic, so that the loops over activations
// vectorize (frexp/ldexp/nearbyint calls cost 8% of a prefill). Callers
// clamp to +-448 first; past 2^100 the magic constant would overflow.
inline float round_to_e4m3(float v) {
  const uint32_t bits = float_to_bits(v), sign = bits & 0x80000000u, magnitude = bits ^ sign;
  const int32_t biased_exponent = int32_t(magnitude >> 23);
  const int32_t step_exponent = biased_exponent - 3 > 127 - 9 ? biased_exponent - 3 : 127 - 9;
  const float magic = bits_to_float(uint32_t(step_exponent + 23) << 23) * 1.5f;
  const float rounded = (bits_to_float(magnitude) + magic) - magic;
  return bits_to_float(float_to_bits(rounded) | sign);
}

// Round |v| <= 6 to the nearest e2m1 value {0, .5, 1, 1.5, 2, 3, 4, 6}, ties to even.
// The grid step is 0.5, 1 or 2 for |v| below 2, 4 and 6; the magnitude is
// rounded to it by adding and subtracting 1.5 * 2^23 steps (nearest even,
// as nearbyint), and v's sign put back, so -0.25 gives -0 as nearbyint does.
// Branch-free, so that the FP4 round trip vectorizes (the indexer's queries
// at 4096 tokens: 0.12 s of a prefill as nearbyint calls).
inline float round_to_e2m1(float v) {
  const uint32_t bits = float_to_bits(v), sign = bits & 0x80000000u;
  const float a = bits_to_float(bits ^ sign);
  const float step = a < 2.0f ? 0.5f : (a < 4.0f ? 1.0f : 2.0f);
  const float magic = step * 12582912.0f;  // 1.5 * 2^23 steps
  const float rounded = (a + magic) - magic;
  return bits_to_float(float_to_bits(rounded) | sign);
}

// FP8 activation round trip (the reference's act_quant with ue8m0 scales),
// in place over `n` values split into blocks of `block`.
void fp8_round_trip(float* x, int64_t n, int64_t block);
// FP4 round trip used by the lightning indexer (blocks of 32, ue8m0 scales).
void fp4_round_trip(float* x, int64_t n, int64_t block);

// V4.1's compressed KV rows: FP4 with one E4M3 scale per `block` values,
// s = e4m3(max(amax, 6 * 2^-9) / 6), q = e2m1(clamp(x / s, +-6)), x <- q * s.
// With `codes` / `scales` non-null it also returns the nibbles (n, one per
// byte) and the scale bytes (n / block), whose product decodes to exactly
// the rounded x.
void fp4_e4m3_round_trip(float* x, int64_t n, int64_t block, uint8_t* codes = nullptr, uint8_t* scales = nullptr);

// Scalar reference versions used by the tests to check the fast paths.
void fp8_round_trip_reference(float* x, int64_t n, int64_t block);

}  // namespace dsv4
