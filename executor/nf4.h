// NF4, the 4-bit NormalFloat of QLoRA (Dettmers et al. 2023, sec. 3), stored as bitsandbytes stores
// it: 16 fixed code values (quantiles of N(0, 1) scaled to [-1, 1], an exact 0), one absmax per
// block of 64 weights, and the absmaxes double-quantized to 8 bits in blocks of 256 with one fp32
// scale each: 4 + 8/64 + 32/(64·256) = 4.127 bits per weight (ftplan::kNf4BytesPerParam).
//   quantize    w / absmax(block) -> the nearest code; two 4-bit indices per byte, the first element
//               in the high nibble (bitsandbytes' packing).
//   dequantize  plain tensor ops (a 256-entry byte -> two codes table, times the block's absmax), in
//               chunks of 256 blocks so that no temporary beyond the output grows with the weight.
// One deviation from bitsandbytes: its 8-bit absmax code is the signed dynamic map applied after
// subtracting the mean absmax; here it is linear over [0, the 256 blocks' max absmax] (the absmaxes
// are positive). Storage is the same: one byte per block, one fp32 per 256 blocks.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/ATen.h>

namespace ftexec {

constexpr int64_t kNf4BlockSize = 64;         // weights per absmax
constexpr int64_t kNf4AbsmaxBlockSize = 256;  // absmaxes per fp32 scale (double quantization)

// bitsandbytes' NF4 code values (functional.py, get_4bit_type("nf4")), index 0..15.
extern const float kNf4Codes[16];

struct Nf4Tensor {
  std::vector<int64_t> shape;  // the weight's, e.g. [out, in]
  int64_t numel = 0;           // a multiple of kNf4BlockSize
  at::Tensor codes;            // uint8 [numel / 2]: two code indices per byte, first in the high nibble
  at::Tensor absmax_q;         // uint8 [numel / 64]: each block's absmax, 8-bit over [0, its scale]
  at::Tensor absmax_scale;     // fp32 [ceil(blocks / 256)]: the largest absmax of each 256 blocks

  int64_t storage_bytes() const;  // codes + absmax_q + absmax_scale, bytes
};

// Quantizes a floating tensor (any dtype/device; numel a multiple of 64, else InputError).
Nf4Tensor nf4_quantize(const at::Tensor& weight);

// The weight in `dtype`, shape `q.shape`, on q's device.
at::Tensor nf4_dequantize(const Nf4Tensor& q, at::ScalarType dtype);

// y = x W^T with W held in NF4: dequantized before the matmul in forward and again in backward (for
// dx = dy W), through a custom autograd function that saves neither x nor W. W is frozen: no dW.
at::Tensor nf4_linear(const at::Tensor& x, const Nf4Tensor& q);

}  // namespace ftexec
