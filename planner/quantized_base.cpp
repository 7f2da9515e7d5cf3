#include "planner/quantized_base.h"

#include <algorithm>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "planner/errors.h"
#include "planner/json_fields.h"
#include "planner/precision.h"

namespace ftplan {
namespace {

// The block linears of every family (model_family.h): a skip list naming one of them leaves part of
// each block unquantised, which this model does not describe.
constexpr const char* kBlockLinearNames[] = {"q_proj", "k_proj", "v_proj", "o_proj", "qkv_proj",
                                             "gate_proj", "up_proj", "down_proj", "gate_up_proj"};

bool ends_with_block_linear(const std::string& module) {
  for (const char* name : kBlockLinearNames) {
    const std::string n(name);
    if (module == n || (module.size() > n.size() && module.compare(module.size() - n.size(), n.size(), n) == 0 &&
                        module[module.size() - n.size() - 1] == '.'))
      return true;
  }
  return false;
}

// Refuses every key of `q` outside `known`, naming them all.
void require_keys(const nlohmann::json& q, const std::vector<std::string>& known, const std::string& where,
                  const std::string& method) {
  std::vector<std::string> unknown;
  for (auto it = q.begin(); it != q.end(); ++it)
    if (std::find(known.begin(), known.end(), it.key()) == known.end()) unknown.push_back(it.key());
  if (unknown.empty()) return;
  std::string msg;
  for (const auto& k : unknown) msg += (msg.empty() ? "" : "; ") + where + "." + k;
  fail_input(msg + ": not modelled for quant_method '" + method + "' (ftplan reads the keys that decide the stored "
             "bytes and knowingly ignores the calibration ones)");
}

// A module skip list must not name a block linear; null, or modules outside the blocks (lm_head, a
// vision tower), are what every quantiser leaves unquantised anyway.
void check_skip_list(const nlohmann::json& q, const char* key, const std::string& where) {
  if (!has_field(q, key)) return;
  const auto& v = q.at(key);
  if (!v.is_array()) fail_input(where + "." + key + ": expected a list of module names, got " + v.dump());
  for (const auto& m : v) {
    if (!m.is_string()) fail_input(where + "." + key + ": expected module names, got " + m.dump());
    if (ends_with_block_linear(m.get<std::string>()))
      fail_input(where + "." + key + ": '" + m.get<std::string>() +
                 "' leaves a block linear unquantised: mixed per-module quantisation is not modelled");
  }
}

double bytes_per_weight_of(const QuantizedBase& q) {
  const int64_t n = 4096;
  return static_cast<double>(quantized_linear_bytes(q, n, n)) / double(n * n);
}

}  // namespace

std::string QuantizedBase::describe() const {
  if (!active()) return "not quantised";
  char bits_text[32];
  std::snprintf(bits_text, sizeof bits_text, "%.3g", bytes_per_weight * 8);
  std::string s = method + " " + std::to_string(bits) + "-bit";
  if (method == "bitsandbytes" && bits == 4) s += " " + format + (double_quant ? " with double quantisation" : "");
  if (method == "mxfp4") s += " e2m1, an e8m0 scale per 32 weights";
  if (method == "gptq" || method == "awq")
    s += group_size > 0 ? ", group " + std::to_string(group_size) : std::string(", one group per input row");
  return s + " (" + bits_text + " bits per weight as stored)";
}

int64_t quantized_linear_bytes(const QuantizedBase& q, int64_t in, int64_t out) {
  if (q.method == "mxfp4") return out * ((in + 31) / 32) * 17;  // 16 bytes of e2m1 codes + 1 e8m0 scale per 32
  if (q.method == "bitsandbytes" && q.bits == 4) return nf4_storage_bytes(in * out, q.double_quant);
  if (q.method == "bitsandbytes") return in * out + 4 * out;  // int8 CB + fp32 SCB per output row
  const int64_t g = q.group_size > 0 ? q.group_size : in;
  const int64_t groups = (in + g - 1) / g;
  const int64_t codes = in * out * q.bits / 8, zeros = groups * out * q.bits / 8, scales = 2 * groups * out;
  if (q.method == "gptq") return codes + zeros + scales + 4 * in;  // + g_idx
  if (q.method == "awq") return codes + zeros + scales;
  return 2 * in * out;
}

QuantizedBase quantized_base_from_json(const nlohmann::json& q, const std::string& config_where, bool has_experts) {
  const std::string where = config_where + ": quantization_config";
  if (!q.is_object()) fail_input(where + ": expected an object");
  QuantizedBase b;
  b.method = read_string_or(q, "quant_method", "", where);
  if (b.method.empty() && (has_field(q, "load_in_4bit") || has_field(q, "load_in_8bit"))) b.method = "bitsandbytes";
  if (b.method == "bitsandbytes") {
    require_keys(q, {"quant_method", "load_in_4bit", "load_in_8bit", "_load_in_4bit", "_load_in_8bit",
                     "bnb_4bit_quant_type", "bnb_4bit_use_double_quant", "bnb_4bit_compute_dtype",
                     "bnb_4bit_quant_storage", "llm_int8_threshold", "llm_int8_skip_modules",
                     "llm_int8_enable_fp32_cpu_offload", "llm_int8_has_fp16_weight"},
                 where, b.method);
    const bool four = read_bool_or(q, "load_in_4bit", read_bool_or(q, "_load_in_4bit", false, where), where);
    const bool eight = read_bool_or(q, "load_in_8bit", read_bool_or(q, "_load_in_8bit", false, where), where);
    if (four == eight)
      fail_input(where + ".load_in_4bit: bitsandbytes needs exactly one of load_in_4bit and load_in_8bit true");
    if (read_bool_or(q, "llm_int8_has_fp16_weight", false, where))
      fail_input(where + ".llm_int8_has_fp16_weight: true keeps fp16 weights beside the int8 ones: not modelled");
    check_skip_list(q, "llm_int8_skip_modules", where);
    if (four) {
      b.bits = 4;
      b.group_size = 64;  // bitsandbytes quantize_4bit's blocksize (transformers does not change it)
      b.format = read_string_or(q, "bnb_4bit_quant_type", "fp4", where);  // BitsAndBytesConfig's default is fp4
      if (b.format != "nf4" && b.format != "fp4")
        fail_input(where + ".bnb_4bit_quant_type: '" + b.format + "' is not nf4 or fp4");
      b.double_quant = read_bool_or(q, "bnb_4bit_use_double_quant", false, where);
    } else {
      b.bits = 8;
      b.group_size = 0;
      b.format = "int8";
    }
  } else if (b.method == "gptq") {
    require_keys(q, {"quant_method", "bits", "group_size", "checkpoint_format", "desc_act", "sym", "static_groups",
                     "true_sequential", "damp_percent", "damp_auto_increment", "model_name_or_path",
                     "model_file_base_name", "meta", "dataset", "tokenizer", "use_exllama", "exllama_config",
                     "disable_exllama", "max_input_length", "module_name_preceding_first_block", "batch_size",
                     "pad_token_id", "use_cuda_fp16", "cache_block_outputs", "backend", "lm_head", "dynamic",
                     "pack_dtype", "modules_in_block_to_quantize", "is_marlin_format", "mse"},
                 where, b.method);
    b.bits = static_cast<int>(read_int(q, "bits", where, 2, 8));
    if (b.bits != 2 && b.bits != 3 && b.bits != 4 && b.bits != 8)
      fail_input(where + ".bits: " + std::to_string(b.bits) + " is not 2, 3, 4 or 8");
    b.group_size = read_int_or(q, "group_size", 128, where, -1, INT64_C(1) << 30);
    if (b.group_size == 0) fail_input(where + ".group_size: 0 (give a positive size, or -1 for one group per row)");
    b.format = read_string_or(q, "checkpoint_format", "gptq", where);
    if (b.format != "gptq" && b.format != "gptq_v2")
      fail_input(where + ".checkpoint_format: '" + b.format + "' is not modelled (gptq, gptq_v2)");
    if (read_bool_or(q, "is_marlin_format", false, where))
      fail_input(where + ".is_marlin_format: the Marlin layout is not modelled");
    if (read_bool_or(q, "lm_head", false, where))
      fail_input(where + ".lm_head: a quantised lm_head is not modelled");
    if (has_field(q, "dynamic") && !q.at("dynamic").empty())
      fail_input(where + ".dynamic: per-module bits and group sizes are not modelled");
    if (has_field(q, "modules_in_block_to_quantize"))
      fail_input(where + ".modules_in_block_to_quantize: quantising part of each block is not modelled");
    if (has_field(q, "pack_dtype") && read_string(q, "pack_dtype", where) != "int32")
      fail_input(where + ".pack_dtype: only int32 packing is modelled");
  } else if (b.method == "awq") {
    require_keys(q, {"quant_method", "bits", "w_bit", "group_size", "q_group_size", "zero_point", "version", "backend",
                     "do_fuse", "fuse_max_seq_len", "modules_to_fuse", "modules_to_not_convert", "exllama_config"},
                 where, b.method);
    b.bits = static_cast<int>(read_int_or(q, "bits", read_int_or(q, "w_bit", 4, where, 1, 8), where, 1, 8));
    if (b.bits != 4) fail_input(where + ".bits: " + std::to_string(b.bits) + ": AutoAWQ packs 4-bit weights only");
    b.group_size = read_int_or(q, "group_size", read_int_or(q, "q_group_size", 128, where, -1, INT64_C(1) << 30), where,
                               -1, INT64_C(1) << 30);
    if (b.group_size == 0) fail_input(where + ".group_size: 0 (give a positive size, or -1 for one group per row)");
    b.format = read_string_or(q, "version", "gemm", where);
    std::transform(b.format.begin(), b.format.end(), b.format.begin(), [](unsigned char c) { return std::tolower(c); });
    if (b.format != "gemm")
      fail_input(where + ".version: '" + b.format + "' is not modelled (gemm: AutoAWQ's WQLinear_GEMM layout)");
    check_skip_list(q, "modules_to_not_convert", where);
  } else if (b.method == "mxfp4") {
    if (!has_experts)
      fail_input(where + ".quant_method: 'mxfp4' quantises the mixture-of-experts weights of gpt-oss (transformers' "
                 "Mxfp4HfQuantizer replaces GptOssExperts only); this model has no experts");
    require_keys(q, {"quant_method", "modules_to_not_convert"}, where, b.method);
    if (has_field(q, "modules_to_not_convert")) {
      const auto& v = q.at("modules_to_not_convert");
      if (!v.is_array()) fail_input(where + ".modules_to_not_convert: expected a list of module names, got " + v.dump());
      for (const auto& m : v)
        if (!m.is_string() || m.get<std::string>().find("experts") != std::string::npos)
          fail_input(where + ".modules_to_not_convert: " + m.dump() +
                     ": leaves experts unquantised: mixed per-module quantisation is not modelled");
    }
    b.bits = 4;
    b.group_size = 32;
    b.format = "mxfp4";
    b.experts_only = true;
  } else {
    fail_input(where + ".quant_method: '" + b.method +
               "' is not modelled (bitsandbytes 4/8-bit, gptq, awq); a quantised base is never counted as bf16");
  }
  b.bytes_per_weight = bytes_per_weight_of(b);
  return b;
}

}  // namespace ftplan
