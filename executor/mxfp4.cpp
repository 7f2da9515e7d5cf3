#include "executor/mxfp4.h"

namespace ftexec {

at::Tensor mxfp4_dequantize(const at::Tensor& blocks, const at::Tensor& scales, at::ScalarType dtype) {
  TORCH_CHECK(blocks.scalar_type() == at::kByte && scales.scalar_type() == at::kByte, "mxfp4: blocks and scales are uint8");
  TORCH_CHECK(blocks.dim() == 4 && blocks.size(3) == 16 && scales.dim() == 3 &&
                  blocks.sizes().slice(0, 3) == scales.sizes(),
              "mxfp4: blocks [E, out, G, 16] and scales [E, out, G] expected");
  // transformers integrations/mxfp4.py FP4_VALUES (the e2m1 codes 0..15).
  static const float kFp4Values[16] = {+0.0f, +0.5f, +1.0f, +1.5f, +2.0f, +3.0f, +4.0f, +6.0f,
                                       -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
  const at::Tensor lut = at::from_blob(const_cast<float*>(kFp4Values), {16}, at::kFloat);
  const at::Tensor b = blocks.to(at::kLong);
  auto decode = [&](const at::Tensor& code) { return lut.index_select(0, code.reshape({-1})).view(code.sizes()); };
  const at::Tensor lo = decode(at::remainder(b, 16));     // [E, out, G, 16]: the low nibbles, elements 0, 2, 4, ...
  const at::Tensor hi = decode(at::div(b, 16, "floor"));  // the high nibbles, elements 1, 3, 5, ...
  const int64_t E = blocks.size(0), out = blocks.size(1), G = blocks.size(2);
  const at::Tensor codes = at::stack({lo, hi}, -1).reshape({E, out, G, 32});
  const at::Tensor scale = at::exp2(scales.to(at::kFloat) - 127.0).unsqueeze(-1);  // torch.ldexp(sub, scales - 127)
  return (codes * scale).reshape({E, out, G * 32}).transpose(1, 2).contiguous().to(dtype);
}

}  // namespace ftexec
