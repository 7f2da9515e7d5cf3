#include "executor/moe.h"

#include <torch/csrc/autograd/custom_function.h>

#include <tuple>

#include "planner/errors.h"

namespace ftexec {
namespace {

const std::string kStar = ".*.";

// Passes the block's output through unchanged; in backward also hands the layer's summed router
// probabilities P_l [E] the load-balancing loss's gradient, coef * E * C_e / N^2 per expert (C: the
// pairs routed to e over every MoE layer, N: the tokens over every MoE layer), times the loss's
// upstream gradient. Only known once every layer has run forward, hence read in backward.
struct AuxGrad : public torch::autograd::Function<AuxGrad> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& y, const at::Tensor& probs_sum,
                            int64_t aux_address) {
    ctx->saved_data["aux"] = aux_address;
    ctx->saved_data["dtype"] = static_cast<int64_t>(probs_sum.scalar_type());
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    const auto* aux = reinterpret_cast<const MoeAux*>(ctx->saved_data["aux"].toInt());
    const double k = static_cast<double>(aux->top_k);
    at::Tensor counts;
    for (const auto& c : aux->counts)
      if (c.defined()) counts = counts.defined() ? counts + c : c.clone();
    const double tokens = counts.sum().item<double>() / k;  // N
    const double E = static_cast<double>(counts.size(0));
    const at::Tensor grad_probs =
        (counts * (aux->grad_scale * aux->coef * E / (tokens * tokens))).to(static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt()));
    return {grad_out[0], grad_probs, at::Tensor()};
  }
};

// The load-balancing loss's value from the recorded counts and probabilities; its backward records the
// upstream gradient for AuxGrad and gives the anchor none.
struct AuxLoss : public torch::autograd::Function<AuxLoss> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& anchor, int64_t aux_address) {
    auto* aux = reinterpret_cast<MoeAux*>(aux_address);
    ctx->saved_data["aux"] = aux_address;
    at::Tensor counts, probs;
    for (size_t l = 0; l < aux->counts.size(); ++l) {
      if (!aux->counts[l].defined()) continue;
      counts = counts.defined() ? counts + aux->counts[l] : aux->counts[l].clone();
      probs = probs.defined() ? probs + aux->probs[l] : aux->probs[l].clone();
    }
    const int64_t E = counts.size(0);
    const double tokens = counts.sum().item<double>() / double(aux->top_k);
    const double value = aux->coef * double(E) * (counts.to(at::kDouble) * probs.to(at::kDouble)).sum().item<double>() /
                         (tokens * tokens);
    return at::full({}, value, anchor.options());
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    auto* aux = reinterpret_cast<MoeAux*>(ctx->saved_data["aux"].toInt());
    aux->grad_scale = grad_out[0].item<double>();
    return {at::Tensor(), at::Tensor()};
  }
};

// gpt-oss's experts on the padded groups xb [E, C, hidden] (GptOssExperts.forward, its training branch, per
// expert): gate_up = xb @ gate_up_proj + gate_up_proj_bias; gate, up = the even and odd columns; the clamped GLU
// (swiglu_limit, alpha 1.702 as GptOssExperts.alpha); @ down_proj + down_proj_bias. Returns [E, C, hidden].
at::Tensor fused_experts(const MoeBlock& b, const ftplan::ModelSpec& spec, const at::Tensor& xb) {
  constexpr double kAlpha = 1.702;  // GptOssExperts.alpha (not a config key)
  const double limit = spec.moe.swiglu_limit;
  const at::Tensor gate_up = at::bmm(xb, b.gate_up_proj) + b.gate_up_proj_bias.unsqueeze(1);  // [E, C, 2I]
  at::Tensor gate = gate_up.slice(-1, 0, c10::nullopt, 2);
  at::Tensor up = gate_up.slice(-1, 1, c10::nullopt, 2);
  if (limit > 0) {
    gate = gate.clamp_max(limit);
    up = up.clamp(-limit, limit);
  }
  const at::Tensor glu = gate * at::sigmoid(gate * kAlpha);
  return at::bmm((up + 1) * glu, b.down_proj) + b.down_proj_bias.unsqueeze(1);  // [E, C, h]
}

}  // namespace

bool moe_layer(const ftplan::ModelSpec& spec, int64_t layer) {
  return spec.moe.active() && spec.moe.moe_layers.at(static_cast<size_t>(layer));
}

namespace {

// One tensor of the block: its checkpoint name ("experts.*." for the stacked experts), its shape and the member
// that holds it. The one list both the tensors and their shapes are read from, in the parameter order.
struct MoeSlot {
  std::string name;
  std::vector<int64_t> shape;
  at::Tensor MoeBlock::*member;
};

std::vector<MoeSlot> moe_slots(const ftplan::ModelSpec& spec) {
  const int64_t E = spec.moe.num_experts, I = spec.moe.expert_intermediate_size, h = spec.hidden_size;
  const auto& n = spec.moe.expert_names;  // gate, up, down: e.g. gate_proj, up_proj, down_proj; w1, w3, w2
  const std::string p = spec.moe.module + ".";  // e.g. "mlp.", "block_sparse_moe."
  if (spec.moe.fused_expert_params)  // gpt-oss: GptOssTopKRouter, GptOssExperts
    return {{p + spec.moe.router_name + ".weight", {E, h}, &MoeBlock::gate},
            {p + spec.moe.router_name + ".bias", {E}, &MoeBlock::router_bias},
            {p + "experts.gate_up_proj", {E, h, 2 * I}, &MoeBlock::gate_up_proj},
            {p + "experts.gate_up_proj_bias", {E, 2 * I}, &MoeBlock::gate_up_proj_bias},
            {p + "experts.down_proj", {E, I, h}, &MoeBlock::down_proj},
            {p + "experts.down_proj_bias", {E, h}, &MoeBlock::down_proj_bias}};
  std::vector<MoeSlot> out{{p + spec.moe.router_name + ".weight", {E, h}, &MoeBlock::gate},
                           {p + "experts.*." + n.at(0) + ".weight", {E, I, h}, &MoeBlock::gate_proj},
                           {p + "experts.*." + n.at(1) + ".weight", {E, I, h}, &MoeBlock::up_proj},
                           {p + "experts.*." + n.at(2) + ".weight", {E, h, I}, &MoeBlock::down_proj}};
  if (spec.moe.shared_expert_gate) out.push_back({p + "shared_expert_gate.weight", {1, h}, &MoeBlock::shared_expert_gate});
  return out;
}

// DeepSeek-V3's e_score_correction_bias, the block's one buffer.
std::vector<MoeSlot> moe_buffer_slots(const ftplan::ModelSpec& spec) {
  if (!spec.moe.router_score_bias) return {};
  return {{spec.moe.module + "." + spec.moe.router_name + ".e_score_correction_bias", {spec.moe.num_experts},
           &MoeBlock::score_bias}};
}

std::vector<std::pair<std::string, at::Tensor*>> tensors_of(MoeBlock& b, const std::vector<MoeSlot>& slots) {
  std::vector<std::pair<std::string, at::Tensor*>> out;
  for (const auto& s : slots) out.emplace_back(s.name, &(b.*s.member));
  return out;
}

std::vector<std::pair<std::string, std::vector<int64_t>>> shapes_of(const std::vector<MoeSlot>& slots) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  for (const auto& s : slots) out.emplace_back(s.name, s.shape);
  return out;
}

}  // namespace

std::vector<std::pair<std::string, at::Tensor*>> moe_named_tensors(MoeBlock& b, const ftplan::ModelSpec& spec) {
  return tensors_of(b, moe_slots(spec));
}

std::vector<std::pair<std::string, std::vector<int64_t>>> moe_tensor_shapes(const ftplan::ModelSpec& spec) {
  return shapes_of(moe_slots(spec));
}

std::vector<std::pair<std::string, at::Tensor*>> moe_named_buffers(MoeBlock& b, const ftplan::ModelSpec& spec) {
  return tensors_of(b, moe_buffer_slots(spec));
}

std::vector<std::pair<std::string, std::vector<int64_t>>> moe_buffer_shapes(const ftplan::ModelSpec& spec) {
  return shapes_of(moe_buffer_slots(spec));
}

namespace {

// Keeps, per token, the experts of the `keep` groups (of n_group, each num_experts / n_group experts) with the
// highest group score; the others' choice scores set to 0 (transformers' masked_fill(~score_mask, 0.0)).
at::Tensor mask_groups(const at::Tensor& choice, const at::Tensor& group_scores, int64_t keep) {
  const int64_t T = choice.size(0), G = group_scores.size(1), E = choice.size(1);
  const at::Tensor group_idx = std::get<1>(group_scores.topk(keep, -1, /*largest=*/true, /*sorted=*/false));
  const at::Tensor group_mask = at::zeros_like(group_scores).scatter_(1, group_idx, 1.0);
  const at::Tensor score_mask = group_mask.unsqueeze(-1).expand({T, G, E / G}).reshape({T, E});
  return choice.masked_fill(score_mask.logical_not(), 0.0);
}

// DeepseekV2MoEGate and DeepseekV3TopkRouter (see moe.h).
MoeRouting deepseek_route(const MoeBlock& b, const ftplan::ModelSpec& spec, const at::Tensor& x) {
  const auto& e = spec.moe;
  const int64_t T = x.size(0), E = e.num_experts, k = e.top_k;
  const at::Tensor logits = at::linear(x.to(at::kFloat), b.gate.to(at::kFloat));  // [T, E] fp32
  MoeRouting r;
  r.probs = e.scoring_func == "sigmoid" ? logits.sigmoid() : at::softmax(logits, -1);
  {
    at::NoGradGuard no_grad;  // the choice has no gradient (V3: get_topk_indices is @torch.no_grad)
    at::Tensor choice = r.probs.detach();
    if (b.score_bias.defined()) choice = choice + b.score_bias.to(at::kFloat).unsqueeze(0);
    if (e.topk_method == "group_limited_greedy")  // V2: a group's score is its best expert's
      choice = mask_groups(choice, std::get<0>(choice.view({T, e.n_group, E / e.n_group}).max(-1)), e.topk_group);
    else if (e.topk_method == "noaux_tc")  // V3: the sum of its best two
      choice = mask_groups(choice, std::get<0>(choice.view({T, e.n_group, E / e.n_group}).topk(2, -1)).sum(-1),
                           e.topk_group);
    r.top_i = std::get<1>(choice.topk(k, -1, /*largest=*/true, /*sorted=*/false));
  }
  r.top_w = r.probs.gather(1, r.top_i);  // the unbiased scores
  if (e.norm_topk_prob) r.top_w = r.top_w / (r.top_w.sum(-1, /*keepdim=*/true) + 1e-20);
  r.top_w = r.top_w * e.routed_scaling_factor;
  return r;
}

}  // namespace

MoeRouting moe_route(const MoeBlock& b, const ftplan::ModelSpec& spec, const at::Tensor& x) {
  if (!spec.moe.topk_method.empty()) return deepseek_route(b, spec, x);
  const int64_t k = spec.moe.top_k;
  MoeRouting r;  // probs: what the load-balancing loss averages, [T, E] fp32
  if (spec.moe.softmax_after_topk) {
    // GptOssTopKRouter: logits = linear(x, weight, bias); top-k of them; softmax over the k values in their
    // dtype; router_scores = zeros.scatter(indices, weights), which load_balancing_loss_func softmaxes again.
    const at::Tensor logits = at::linear(x, b.gate, b.router_bias);  // [T, E]
    at::Tensor top_v;
    std::tie(top_v, r.top_i) = logits.topk(k, -1);
    r.top_w = at::softmax(top_v, -1);
    r.probs = at::softmax(at::zeros_like(logits).scatter(1, r.top_i, r.top_w), -1, at::kFloat);
    return r;
  }
  // The router: softmax in fp32, top-k, renormalised when the config says so, cast to the compute dtype.
  r.probs = at::softmax(at::linear(x, b.gate), -1, at::kFloat);  // [T, E]
  std::tie(r.top_w, r.top_i) = r.probs.topk(k, -1);              // [T, k]
  if (spec.moe.norm_topk_prob) r.top_w = r.top_w / r.top_w.sum(-1, /*keepdim=*/true);
  r.top_w = r.top_w.to(x.scalar_type());
  return r;
}

std::vector<std::pair<std::string, at::Tensor>> moe_checkpoint_tensors(const std::string& name, const at::Tensor& t) {
  const size_t star = name.find(kStar);
  if (star == std::string::npos) return {{name, t}};
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (int64_t e = 0; e < t.size(0); ++e)
    out.emplace_back(name.substr(0, star + 1) + std::to_string(e) + name.substr(star + 2), t.select(0, e));
  return out;
}

std::vector<std::pair<std::string, std::vector<int64_t>>> moe_checkpoint_shapes(const std::string& name,
                                                                                const std::vector<int64_t>& shape) {
  const size_t star = name.find(kStar);
  if (star == std::string::npos) return {{name, shape}};
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  const std::vector<int64_t> one(shape.begin() + 1, shape.end());
  for (int64_t e = 0; e < shape.at(0); ++e) out.emplace_back(name.substr(0, star + 1) + std::to_string(e) + name.substr(star + 2), one);
  return out;
}

at::Tensor moe_forward(const MoeBlock& b, const ftplan::ModelSpec& spec, const at::Tensor& x_in, MoeAux& aux,
                       int64_t layer) {
  const int64_t E = spec.moe.num_experts, k = spec.moe.top_k, h = spec.hidden_size;
  const int64_t B = x_in.size(0), S = x_in.size(1), T = B * S;
  const at::Tensor x = x_in.reshape({T, h});

  MoeRouting routing = moe_route(b, spec, x);
  const at::Tensor& probs = routing.probs;
  const at::Tensor& top_w = routing.top_w;
  const at::Tensor& top_i = routing.top_i;

  // Pairs p = t * k + j, sorted by expert (stable: by token within an expert), each given a row of the
  // padded [E, C] layout: slot = expert * C + its rank among that expert's pairs.
  at::Tensor slot_of_pair, token_of_slot, counts;
  int64_t C = 0;
  {
    at::NoGradGuard no_grad;
    const at::Tensor expert = top_i.reshape({-1});                        // [P]
    counts = at::bincount(expert, {}, E);                                 // [E] int64
    C = std::max<int64_t>(1, counts.max().item<int64_t>());
    auto sorted = at::sort(expert, /*stable=*/true, 0, /*descending=*/false);
    const at::Tensor& order = std::get<1>(sorted);                       // pairs by expert
    const at::Tensor& sorted_expert = std::get<0>(sorted);
    const at::Tensor start = counts.cumsum(0) - counts;                  // each expert's first sorted position
    const at::Tensor rank = at::arange(expert.size(0), expert.options()) - start.index_select(0, sorted_expert);
    const at::Tensor slot_sorted = sorted_expert * C + rank;            // [P]: the row of sorted pair i
    const at::Tensor pair_token = at::div(order, k, "floor");           // [P]: the token of sorted pair i
    slot_of_pair = at::empty_like(slot_sorted).index_copy_(0, order, slot_sorted);  // [P]: the row of pair p
    // [E * C]: the token each row reads, T (a zero row) where the expert has fewer pairs.
    token_of_slot = at::full({E * C}, T, expert.options()).index_copy_(0, slot_sorted, pair_token);
  }
  aux.max_capacity_factor = std::max(aux.max_capacity_factor, double(E * C) / double(T * k));

  // The experts as three batched GEMMs over the padded groups (zero rows where an expert has fewer pairs).
  // The rows are gathered from x and one zero row: index_select keeps only its index for backward (copying
  // the tokens into a zero buffer with index_copy_ would keep the copied source, T x k rows, as well).
  const at::Tensor xe = at::cat({x, at::zeros({1, h}, x.options())}).index_select(0, token_of_slot);
  const at::Tensor xb = xe.view({E, C, h});
  const at::Tensor ye = spec.moe.fused_expert_params ? fused_experts(b, spec, xb) : [&] {
    const at::Tensor gate = at::bmm(xb, b.gate_proj.transpose(1, 2));  // [E, C, I]
    const at::Tensor up = at::bmm(xb, b.up_proj.transpose(1, 2));
    return at::bmm(at::silu(gate) * up, b.down_proj.transpose(1, 2));  // [E, C, h]
  }();
  // Back to pair order, weighted, summed over each token's k experts.
  // (DeepSeek's weights are fp32: the products and the sum in fp32, then cast back, as its MoE combines them.)
  at::Tensor y = ye.view({E * C, h}).index_select(0, slot_of_pair).view({T, k, h});
  if (top_w.scalar_type() != y.scalar_type()) y = (y.to(top_w.scalar_type()) * top_w.unsqueeze(-1)).sum(1).to(x.scalar_type());
  else y = (y * top_w.unsqueeze(-1)).sum(1);

  // What the load-balancing loss reads (every forward records it, so the value is always at hand).
  if (aux.counts.size() <= static_cast<size_t>(layer)) aux.counts.resize(static_cast<size_t>(layer) + 1);
  if (aux.probs.size() <= static_cast<size_t>(layer)) aux.probs.resize(static_cast<size_t>(layer) + 1);
  aux.counts[static_cast<size_t>(layer)] = counts.to(at::kFloat);
  aux.probs[static_cast<size_t>(layer)] = probs.detach().sum(0);
  // (Under LoRA the router is frozen, but the probabilities still depend on the adapters upstream.)
  if (aux.enabled && at::GradMode::is_enabled() && probs.requires_grad())
    y = AuxGrad::apply(y, probs.sum(0), reinterpret_cast<int64_t>(&aux));
  return y.view({B, S, h});
}

at::Tensor moe_add_shared(const MoeBlock& b, const at::Tensor& x, const at::Tensor& routed, const at::Tensor& shared) {
  // Qwen2MoeSparseMoeBlock: shared_expert_output = F.sigmoid(self.shared_expert_gate(hidden_states)) *
  // shared_expert_output; final_hidden_states = final_hidden_states + shared_expert_output.
  if (!b.shared_expert_gate.defined()) return routed + shared;
  return routed + at::sigmoid(at::linear(x, b.shared_expert_gate)) * shared;
}

at::Tensor moe_aux_loss(MoeAux& aux, const at::Tensor& anchor) {
  return AuxLoss::apply(anchor, reinterpret_cast<int64_t>(&aux));
}

}  // namespace ftexec
