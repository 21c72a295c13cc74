#include "gradnorm/oracles/tolerance.hpp"

#include <cmath>

namespace gradnorm::oracles {

const Tolerance& tolerance_for(scenarios::DType dtype) {
  static const Tolerance kFloat64{
      1e-6, 1e-6,
      "float64 training still applies 1/N as a float32 scalar (the recipe divides 1 by an int64 "
      "tensor) and logs the loss as a float32 division: 2^-24 = 6e-8 relative per rounding; "
      "1e-6 leaves 16x room"};
  static const Tolerance kFloat32{
      1e-5, 1e-5,
      "float32 forward and backward: unit roundoff 6e-8 summed over dot products of length <= 64, "
      "a log-softmax over the vocabulary and the 1/N scaling; 1e-5 is ~150 roundings"};
  static const Tolerance kBFloat16{
      5e-2, 2e-2,
      "bfloat16 parameters, activations and gradients: unit roundoff 2^-9 = 2e-3 compounded "
      "through embedding, two linears, tanh and their backward; the loss itself is float32"};
  switch (dtype) {
    case scenarios::DType::float64: return kFloat64;
    case scenarios::DType::float32: return kFloat32;
    case scenarios::DType::bfloat16: return kBFloat16;
  }
  return kFloat32;
}

double ulp_of(double value, scenarios::DType dtype) {
  const int mantissa_bits = dtype == scenarios::DType::float64   ? 52
                            : dtype == scenarios::DType::float32 ? 23
                                                                 : 7;
  const double magnitude = std::abs(value);
  if (magnitude == 0 || !std::isfinite(magnitude)) return 0;
  int exponent = 0;
  std::frexp(magnitude, &exponent);  // magnitude = f * 2^exponent, f in [0.5, 1)
  return std::ldexp(1.0, exponent - 1 - mantissa_bits);
}

}  // namespace gradnorm::oracles
