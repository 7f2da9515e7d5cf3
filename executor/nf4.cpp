#include "executor/nf4.h"

#include <torch/csrc/autograd/custom_function.h>

#include <string>

#include "executor/llama_model.h"
#include "planner/errors.h"

namespace ftexec {

const float kNf4Codes[16] = {-1.0f,
                             -0.6961928009986877f,
                             -0.5250730514526367f,
                             -0.39491748809814453f,
                             -0.28444138169288635f,
                             -0.18477343022823334f,
                             -0.09105003625154495f,
                             0.0f,
                             0.07958029955625534f,
                             0.16093020141124725f,
                             0.24611230194568634f,
                             0.33791524171829224f,
                             0.44070982933044434f,
                             0.5626170039176941f,
                             0.7229568362236023f,
                             1.0f};

namespace {

at::Tensor code_table(const at::Device& device) {
  return at::from_blob(const_cast<float*>(kNf4Codes), {16}, at::kFloat).to(device);
}

// byte -> (code of its high nibble, code of its low nibble): [256, 2] fp32.
at::Tensor byte_table(const at::Device& device) {
  const at::Tensor codes = code_table(at::kCPU);
  const at::Tensor bytes = at::arange(256, at::kLong);
  return at::stack({codes.index_select(0, bytes.div(16, "floor")), codes.index_select(0, bytes.remainder(16))}, 1)
      .to(device);
}

// Each block's absmax as dequantization sees it (fp32 [blocks]).
at::Tensor block_absmax(const Nf4Tensor& q) {
  const int64_t blocks = q.absmax_q.numel();
  const at::Tensor group = at::arange(blocks, q.absmax_q.options().dtype(at::kLong)).div(kNf4AbsmaxBlockSize, "floor");
  return q.absmax_q.to(at::kFloat).mul(1.0 / 255.0).mul(q.absmax_scale.index_select(0, group));
}

}  // namespace

int64_t Nf4Tensor::storage_bytes() const {
  return int64_t(codes.nbytes() + absmax_q.nbytes() + absmax_scale.nbytes());
}

Nf4Tensor nf4_quantize(const at::Tensor& weight) {
  at::NoGradGuard no_grad;
  Nf4Tensor q;
  q.shape = weight.sizes().vec();
  q.numel = weight.numel();
  if (q.numel % kNf4BlockSize != 0)
    ftplan::fail_input("NF4: a weight of shape " + shape_to_string(weight.sizes()) + " (" + std::to_string(q.numel) +
                       " elements) is not a multiple of the block size " + std::to_string(kNf4BlockSize));
  const int64_t blocks = q.numel / kNf4BlockSize;
  const int64_t groups = (blocks + kNf4AbsmaxBlockSize - 1) / kNf4AbsmaxBlockSize;
  const at::Tensor w = weight.detach().to(at::kFloat).reshape({blocks, kNf4BlockSize});
  // First level: absmax per 64 weights. Second: 8 bits per absmax over [0, max of its 256 blocks].
  const at::Tensor absmax = w.abs().amax(1);
  const at::Tensor padded = at::zeros({groups * kNf4AbsmaxBlockSize}, absmax.options());
  padded.narrow(0, 0, blocks).copy_(absmax);
  q.absmax_scale = padded.view({groups, kNf4AbsmaxBlockSize}).amax(1).contiguous();
  const at::Tensor group = at::arange(blocks, absmax.options().dtype(at::kLong)).div(kNf4AbsmaxBlockSize, "floor");
  const at::Tensor scale = q.absmax_scale.index_select(0, group).clamp_min(1e-30);
  q.absmax_q = absmax.div(scale).mul(255.0).round().clamp(0, 255).to(at::kByte);
  // Normalise by the absmax dequantization will use (so the codes and the scale agree), nearest code.
  const at::Tensor used = block_absmax(q).clamp_min(1e-30);
  const at::Tensor x = w.div(used.unsqueeze(1)).clamp(-1, 1).reshape({-1});
  const at::Tensor codes = code_table(x.device());
  const at::Tensor mids = codes.slice(0, 1).add(codes.slice(0, 0, 15)).mul(0.5);  // 15 decision boundaries
  const at::Tensor idx = at::bucketize(x, mids).to(at::kByte).view({-1, 2});
  q.codes = idx.select(1, 0).mul(16).add(idx.select(1, 1)).contiguous();
  return q;
}

at::Tensor nf4_dequantize(const Nf4Tensor& q, at::ScalarType dtype) {
  at::NoGradGuard no_grad;
  const at::Device device = q.codes.device();
  at::Tensor out = at::empty({q.numel}, at::TensorOptions().dtype(dtype).device(device));
  const at::Tensor table = byte_table(device);
  const at::Tensor absmax = block_absmax(q);
  const int64_t blocks = q.numel / kNf4BlockSize;
  const int64_t chunk = kNf4AbsmaxBlockSize;  // blocks per pass: bounded temporaries
  for (int64_t b0 = 0; b0 < blocks; b0 += chunk) {
    const int64_t nb = std::min(chunk, blocks - b0);
    const at::Tensor bytes = q.codes.narrow(0, b0 * kNf4BlockSize / 2, nb * kNf4BlockSize / 2).to(at::kLong);
    const at::Tensor values = table.index_select(0, bytes).view({nb, kNf4BlockSize});
    out.narrow(0, b0 * kNf4BlockSize, nb * kNf4BlockSize)
        .view({nb, kNf4BlockSize})
        .copy_(values.mul(absmax.narrow(0, b0, nb).unsqueeze(1)));
  }
  return out.view(q.shape);
}

namespace {

// Saves the NF4 tensors (persistent: no extra memory), never x or the dequantized weight.
struct Nf4LinearFn : public torch::autograd::Function<Nf4LinearFn> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& codes,
                            const at::Tensor& absmax_q, const at::Tensor& absmax_scale, at::IntArrayRef shape) {
    ctx->save_for_backward({codes, absmax_q, absmax_scale});
    ctx->saved_data["shape"] = shape.vec();
    Nf4Tensor q{shape.vec(), codes.numel() * 2, codes, absmax_q, absmax_scale};
    return at::linear(x, nf4_dequantize(q, x.scalar_type()));
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad) {
    const auto saved = ctx->get_saved_variables();
    const auto shape = ctx->saved_data["shape"].toIntVector();
    Nf4Tensor q{shape, saved[0].numel() * 2, saved[0], saved[1], saved[2]};
    const at::Tensor dy = grad[0];
    at::Tensor dx = at::matmul(dy, nf4_dequantize(q, dy.scalar_type()));
    return {dx, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor nf4_linear(const at::Tensor& x, const Nf4Tensor& q) {
  return Nf4LinearFn::apply(x, q.codes, q.absmax_q, q.absmax_scale, q.shape);
}

}  // namespace ftexec
