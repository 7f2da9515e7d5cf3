#include "planner/config_import.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <yaml-cpp/yaml.h>

#include "planner/data_paths.h"
#include "planner/errors.h"
#include "planner/framework.h"
#include "planner/job_fields.h"
#include "planner/json_fields.h"

namespace ftplan {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}
bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }
bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
// A value as a message shows it: strings without quotes, the rest as JSON.
std::string shown(const Json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }

// ---------------------------------------------------------------------------------------------
// YAML as PyYAML reads it.

bool plain_integer(const std::string& s, int64_t& out) {
  std::string digits;
  size_t i = 0;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) digits += s[i++];
  if (i == s.size()) return false;
  for (; i < s.size(); ++i) {
    if (std::isdigit(static_cast<unsigned char>(s[i]))) digits += s[i];
    else if (s[i] != '_') return false;
  }
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(digits.c_str(), &end, 10);
  if (errno == ERANGE || *end) return false;
  out = v;
  return true;
}

bool plain_float(const std::string& s, double& out) {
  std::string text;
  for (char c : s)
    if (c != '_') text += c;
  if (text.empty() || text.find_first_of("0123456789") == std::string::npos) return false;
  if (text.find_first_not_of("+-.0123456789eE") != std::string::npos) return false;
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (*end || errno == ERANGE || !std::isfinite(v)) return false;
  out = v;
  return true;
}

Json scalar_json(const YAML::Node& n) {
  const std::string& s = n.Scalar();
  if (n.Tag() == "!") return s;  // quoted: a string
  if (s.empty() || s == "~" || s == "null" || s == "Null" || s == "NULL") return nullptr;
  static const std::set<std::string> yes{"true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON"};
  static const std::set<std::string> no{"false", "False", "FALSE", "no", "No", "NO", "off", "Off", "OFF"};
  if (yes.count(s)) return true;
  if (no.count(s)) return false;
  int64_t i = 0;
  if (plain_integer(s, i)) return i;
  double x = 0;
  if (plain_float(s, x)) return x;
  return s;
}

// A YAML document's nodes, aliases expanded: bounded, so that a file of aliases to aliases cannot
// grow without limit.
Json node_json(const YAML::Node& n, size_t& budget) {
  if (budget-- == 0) throw YAML::Exception(n.Mark(), "too many nodes (over 1,000,000, aliases expanded)");
  switch (n.Type()) {
    case YAML::NodeType::Scalar: return scalar_json(n);
    case YAML::NodeType::Sequence: {
      Json a = Json::array();
      for (const auto& item : n) a.push_back(node_json(item, budget));
      return a;
    }
    case YAML::NodeType::Map: {
      Json o = Json::object();
      for (auto it = n.begin(); it != n.end(); ++it) o[it->first.as<std::string>()] = node_json(it->second, budget);
      return o;
    }
    default: return nullptr;
  }
}

std::string read_text(const std::string& path, const std::string& field) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) fail_input(field + ": no such file '" + path + "'");
  std::ifstream in(path, std::ios::binary);
  if (!in) fail_input(field + ": cannot read '" + path + "'");
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// ---------------------------------------------------------------------------------------------
// configs/import/model_names.json

struct ModelNames {
  std::vector<std::pair<std::string, std::string>> hf;         // id, model
  std::vector<std::pair<std::string, std::string>> torchtune;  // builder, model
  std::vector<TorchtuneBuilder> torchtune_rows;
};

const ModelNames& model_names() {
  static const ModelNames names = [] {
    const std::string path = (fs::path(data_dir()) / "configs" / "import" / "model_names.json").string();
    const Json j = read_json_file(path);
    require_known_keys(j, {"format", "description", "hf", "torchtune"}, path);
    if (read_string(j, "format", path) != "ftplan-model-names/1") fail_input(path + ": format: expected ftplan-model-names/1");
    ModelNames n;
    for (const char* section : {"hf", "torchtune"}) {
      if (!j.contains(section) || !j.at(section).is_array()) fail_input(path + ": " + section + ": expected a list");
      for (const auto& row : j.at(section)) {
        const std::string where = path + ": " + section;
        const char* name_key = std::string(section) == "hf" ? "id" : "builder";
        if (std::string(section) == "hf") {
          require_known_keys(row, {"id", "model", "note"}, where);
        } else {
          require_known_keys(row, {"builder", "model", "tokenizer", "checkpoint_model_type", "note"}, where);
          n.torchtune_rows.push_back({read_string(row, "builder", where), read_string(row, "tokenizer", where),
                                      read_string(row, "checkpoint_model_type", where)});
        }
        auto& list = std::string(section) == "hf" ? n.hf : n.torchtune;
        list.emplace_back(read_string(row, name_key, where), read_string(row, "model", where));
      }
    }
    return n;
  }();
  return names;
}

// ---------------------------------------------------------------------------------------------
// Reading one file.

// Where a file that names another (axolotl's deepspeed:) finds it: as given, beside the file, in a
// folder above it (a repository's root, where the project's docs run from), or the working directory.
std::optional<std::string> find_named_file(const std::string& name, const std::string& from_file) {
  std::error_code ec;
  const fs::path p(name);
  if (p.is_absolute()) return fs::is_regular_file(p, ec) ? std::optional(p.string()) : std::nullopt;
  for (fs::path dir = fs::absolute(from_file, ec).parent_path(); !dir.empty(); dir = dir.parent_path()) {
    if (fs::is_regular_file(dir / p, ec)) return fs::proximate(dir / p, ec).lexically_normal().string();
    if (dir == dir.root_path()) break;
  }
  if (fs::is_regular_file(p, ec)) return p.string();
  return std::nullopt;
}

struct Document {
  Json json;                       // an object for configs
  std::vector<std::string> lines;  // a launch script's lines (continuations joined)
  std::optional<ConfigKind> kind;
};

std::optional<ConfigKind> script_kind(const std::vector<std::string>& lines) {
  bool torchrun = false;
  for (const auto& l : lines) {
    if (starts_with(l, "#SBATCH")) return ConfigKind::slurm;
    if (!starts_with(l, "#") && l.find("torchrun") != std::string::npos) torchrun = true;
  }
  return torchrun ? std::optional(ConfigKind::torchrun) : std::nullopt;
}

Document read_document(const std::string& path) {
  const std::string text = read_text(path, "--from");
  Document d;
  const std::string ext = lower(fs::path(path).extension().string());
  const size_t first = text.find_first_not_of(" \t\r\n");
  const bool script = starts_with(text, "#!") || ext == ".sh" || ext == ".sbatch" || ext == ".slurm";
  if (script) {
    std::istringstream in(text);
    std::string line, joined;
    while (std::getline(in, line)) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (!line.empty() && line.back() == '\\') {
        joined += line.substr(0, line.size() - 1) + " ";
        continue;
      }
      joined += line;
      const size_t start = joined.find_first_not_of(" \t");
      d.lines.push_back(start == std::string::npos ? "" : joined.substr(start));
      joined.clear();
    }
    if (!joined.empty()) d.lines.push_back(joined);
    d.kind = script_kind(d.lines);
    return d;
  }
  if (ext == ".json" || (ext != ".yaml" && ext != ".yml" && first != std::string::npos && text[first] == '{'))
    d.json = read_json_file(path);
  else
    d.json = yaml_to_json(text, path);
  if (!d.json.is_object()) fail_input(path + ": expected a mapping of keys (a config file), got " + std::string(d.json.type_name()));
  d.kind = detect_config_kind(d.json);
  return d;
}

struct Importer;

// The state of reading one file: its name in messages and where its keys land.
struct FileReader {
  Importer& all;
  ConfigImport& imp;
  std::string file;  // as given, e.g. "axolotl.yml", or "hf.json: deepspeed" for an inline config
  std::string path;  // the file on disk, for the files it names

  std::string at(const std::string& key) const { return file + ": " + key; }
  void ignore(const std::string& key) { imp.ignored_keys.push_back(at(key)); }
  void note(const std::string& text) { imp.notes.push_back(text); }
  void automatic(const std::string& key, const std::string& job_key) { imp.autos.push_back({at(key), job_key}); }

  void set(const std::string& job_key, const Json& value, const std::string& src_key, const Json& as_written);
  void set(const std::string& job_key, const Json& value, const std::string& src_key) { set(job_key, value, src_key, value); }
  void set_layout(ImportedLayout layout);
  void set_framework(const std::string& name, const std::string& src_key);
  void set_precision_mode(const std::string& mode, const std::string& src_key, const Json& as_written);
  void set_model(const std::string& name, const std::string& src_key);
  void set_max_steps(const Json& v, const std::string& src_key, bool per_epoch);
  void named_deepspeed(const Json& v, const std::string& src_key);

  // Typed reads naming "file: key".
  bool boolean(const Json& v, const std::string& key) const {
    if (!v.is_boolean()) fail_input(at(key) + ": expected true or false, got " + v.dump());
    return v.get<bool>();
  }
  int64_t integer(const Json& v, const std::string& key, int64_t lo, int64_t hi) const {
    const bool whole = v.is_number_integer() ||
                       (v.is_number_float() && std::isfinite(v.get<double>()) && std::floor(v.get<double>()) == v.get<double>());
    if (!whole) fail_input(at(key) + ": expected a whole number, got " + v.dump());
    const double x = v.get<double>();
    if (x < double(lo) || x > double(hi))
      fail_input(at(key) + ": " + v.dump() + " is out of range [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    return static_cast<int64_t>(x);
  }
  std::string text(const Json& v, const std::string& key) const {
    if (!v.is_string()) fail_input(at(key) + ": expected a string, got " + v.dump());
    return v.get<std::string>();
  }
  const Json& object(const Json& v, const std::string& key) const {
    if (!v.is_object()) fail_input(at(key) + ": expected a mapping of keys, got " + v.dump());
    return v;
  }
  [[noreturn]] void unmodelled(const std::string& key, const Json& v, const std::string& why) const {
    fail_input(at(key) + ": " + shown(v) + ": " + why);
  }
};

struct Importer {
  ConfigImport imp;
  bool deepspeed_given = false;  // a DeepSpeed config is among the --from files
  std::vector<std::string> seen;  // canonical paths read
  std::vector<std::pair<std::string, std::string>> named;  // (path, named by) files to read after

  void read_file(const std::string& path, const std::string& named_by);
  void read_deepspeed(FileReader& r, const Json& j);
};

// ---------------------------------------------------------------------------------------------
// Values, with their conflicts.

std::string with_value(const std::string& origin, const std::string& written) {
  return written.empty() ? origin : origin + " " + written;
}

// Two values of one job field are the same job when they land on the same setup.
bool same_job_value(const FieldSpec& f, const Json& a, const Json& b) {
  TrainingSetup x, y;
  x.method = y.method = Method::qlora;  // so that lora.* and quantization.* are printed
  apply_job_field(x, f, a, f.key);
  apply_job_field(y, f, b, f.key);
  return training_setup_to_json(x) == training_setup_to_json(y);
}

void FileReader::set(const std::string& job_key, const Json& value, const std::string& src_key, const Json& as_written) {
  const FieldSpec& f = field_by_key(job_key);
  TrainingSetup scratch;
  scratch.method = Method::qlora;
  apply_job_field(scratch, f, value, at(src_key));  // the field table's type and range, naming file: key
  const std::string written = as_written.is_null() ? "" : shown(as_written);  // null: a default, no value written
  for (const auto& v : imp.values) {
    if (v.key != job_key) continue;
    if (!same_job_value(f, v.value, value))
      fail_input(with_value(v.origin, v.as_written) + " disagrees with " + with_value(at(src_key), written) + " (both set " +
                 job_key + ")");
    return;  // the same value, already there
  }
  imp.values.push_back({job_key, value, at(src_key), written});
}

bool same_layout(const ImportedLayout& a, const ImportedLayout& b) {
  return a.sharding == b.sharding && (a.sharding == Sharding::none || a.zero_stage == b.zero_stage) &&
         a.reshard_after_forward == b.reshard_after_forward && a.hybrid == b.hybrid &&
         a.offload_optimizer == b.offload_optimizer && a.offload_params == b.offload_params && a.tp == b.tp &&
         a.sequence_parallel == b.sequence_parallel &&
         a.cp == b.cp && a.pp == b.pp && a.dp_replicate == b.dp_replicate && a.dp_shard == b.dp_shard;
}

void FileReader::set_layout(ImportedLayout layout) {
  if (!imp.layout || (!imp.layout->explicit_layout && layout.explicit_layout)) {
    imp.layout = layout;
    return;
  }
  if (!layout.explicit_layout) return;  // a default never overrides what a file says
  if (!same_layout(*imp.layout, layout))
    fail_input(imp.layout->origin + " (" + imp.layout->describe() + ") disagrees with " + layout.origin + " (" +
               layout.describe() + ")");
}

void FileReader::set_framework(const std::string& name, const std::string& src_key) {
  // The Hugging Face Trainer runs DeepSpeed and FSDP: those profiles refine "hf".
  const auto refines_hf = [](const std::string& n) { return n == "deepspeed" || n == "fsdp"; };
  if (imp.framework.empty() || (imp.framework == "hf" && refines_hf(name))) {
    imp.framework = name;
    imp.framework_origin = at(src_key);
  } else if (imp.framework != name && !(name == "hf" && refines_hf(imp.framework))) {
    fail_input(imp.framework_origin + " (framework " + imp.framework + ") disagrees with " + at(src_key) +
               " (framework " + name + ")");
  }
}

void FileReader::set_precision_mode(const std::string& mode, const std::string& src_key, const Json& as_written) {
  if (imp.precision_mode.empty()) {
    imp.precision_mode = mode;
    imp.precision_origin = at(src_key);
    imp.precision_written = shown(as_written);
  } else if (imp.precision_mode != mode) {
    fail_input(imp.precision_origin + " " + imp.precision_written + " (" + imp.precision_mode + ") disagrees with " +
               at(src_key) + " " + shown(as_written) + " (" + mode + ")");
  }
}

void FileReader::set_model(const std::string& name, const std::string& src_key) {
  std::error_code ec;
  // A local checkout: a folder holding config.json, or the config.json itself.
  for (const fs::path& base : {fs::absolute(path, ec).parent_path(), fs::current_path(ec)}) {
    const fs::path p = fs::path(name).is_absolute() ? fs::path(name) : base / name;
    if (fs::is_regular_file(p / "config.json", ec)) return set("model", (p / "config.json").lexically_normal().string(), src_key, name);
    if (ends_with(name, ".json") && fs::is_regular_file(p, ec)) return set("model", p.lexically_normal().string(), src_key, name);
  }
  if (const auto m = model_for_hf_id(name)) {
    note(at(src_key) + " " + name + ": model " + *m + " (configs/import/model_names.json)");
    return set("model", *m, src_key, name);
  }
  if (fs::is_regular_file(fs::path(data_dir()) / "configs" / "models" / (name + ".json"), ec)) return set("model", name, src_key);
  if (imp.unknown_model.empty()) {
    imp.unknown_model = name;
    imp.unknown_model_origin = at(src_key);
  }
}

void FileReader::set_max_steps(const Json& v, const std::string& src_key, bool per_epoch) {
  const int64_t steps = integer(v, src_key, -1, int64_t(1) << 40);
  if (steps <= 0) return;  // -1 / 0: not set (HF TrainingArguments' default)
  if (imp.max_steps && *imp.max_steps != steps)
    fail_input(imp.max_steps_origin + " " + std::to_string(*imp.max_steps) + " disagrees with " + at(src_key) + " " +
               std::to_string(steps));
  imp.max_steps = steps;
  imp.max_steps_per_epoch = per_epoch;
  imp.max_steps_origin = at(src_key);
}

// axolotl / LLaMA-Factory / TrainingArguments `deepspeed:`: a path, or the config inline.
void FileReader::named_deepspeed(const Json& v, const std::string& src_key) {
  set_framework("deepspeed", src_key);
  if (v.is_object()) {
    FileReader inline_reader{all, imp, at(src_key), path};
    all.read_deepspeed(inline_reader, v);
    return;
  }
  const std::string name = text(v, src_key);
  if (name.empty()) return;
  if (all.deepspeed_given) {
    note(at(src_key) + " names " + name + "; the DeepSpeed config given with --from is read instead");
    return;
  }
  const auto found = find_named_file(name, path);
  if (!found)
    fail_input(at(src_key) + ": '" + name + "' not found beside " + file +
               ", in a folder above it or in the working directory; give it with --from");
  all.named.emplace_back(*found, at(src_key));
}

void read_epochs(FileReader& r, const Json& v, const std::string& key);

// ---------------------------------------------------------------------------------------------
// Shared readers: precision flags, optimizer names, FSDP options as the HF Trainer takes them.

void read_bf16_fp16(FileReader& r, const Json& j) {
  // HF TrainingArguments / axolotl / LLaMA-Factory: bf16 and fp16 booleans ("auto": bf16 where the GPU has it).
  const bool has_bf16 = j.contains("bf16") && !j.at("bf16").is_null();
  const bool has_fp16 = j.contains("fp16") && !j.at("fp16").is_null();
  const auto on = [&](const char* key) {
    const Json& v = j.at(key);
    if (v.is_string() && v == "auto") return true;
    return r.boolean(v, key);
  };
  const bool bf16 = has_bf16 && on("bf16"), fp16 = has_fp16 && on("fp16");
  if (bf16 && fp16) fail_input(r.at("bf16") + " and " + r.at("fp16") + ": both true");
  if (bf16) r.set_precision_mode("bf16", "bf16", j.at("bf16"));
  else if (fp16) r.set_precision_mode("fp16", "fp16", j.at("fp16"));
  else if (has_bf16 || has_fp16) r.set_precision_mode("fp32", has_bf16 ? "bf16" : "fp16", j.at(has_bf16 ? "bf16" : "fp16"));
}

// HF TrainingArguments' `optim` and axolotl's `optimizer` names (transformers OptimizerNames).
void read_optimizer_name(FileReader& r, const Json& v, const std::string& key) {
  const std::string name = lower(r.text(v, key));
  static const std::set<std::string> adamw{"adamw_torch", "adamw_torch_fused", "adamw_hf", "adamw_apex_fused",
                                           "adamw_torch_xla", "adamw_torch_npu_fused", "adamw", "adam"};
  static const std::set<std::string> adamw8bit{"adamw_bnb_8bit", "adamw_8bit", "adamw_torch_8bit", "paged_adamw_8bit",
                                               "adamw_torchao_8bit"};
  static const std::set<std::string> paged32{"paged_adamw_32bit", "paged_adamw"};
  if (adamw.count(name)) r.set("optimizer", "adamw", key, v);
  else if (adamw8bit.count(name)) r.set("optimizer", "adamw8bit", key, v);
  else if (paged32.count(name)) r.set("optimizer", "adamw", key, v);
  else if (name == "sgd") r.set("optimizer", "sgd", key, v);
  else r.unmodelled(key, v, "not modelled (the optimizers ftplan plans: adamw, adamw8bit, sgd, and their paged variants)");
  if (starts_with(name, "paged_")) r.set("paged_optimizer", true, key, v);
}

ImportedLayout fsdp_layout(const std::string& origin) {
  ImportedLayout l;
  l.sharding = Sharding::fsdp;
  l.zero_stage = 3;
  l.origin = origin;
  return l;
}

// A sharding strategy name or number (torch.distributed.fsdp.ShardingStrategy).
void read_sharding_strategy(FileReader& r, ImportedLayout& l, const Json& v, const std::string& key) {
  std::string s = v.is_number_integer() ? std::to_string(v.get<int64_t>()) : r.text(v, key);
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (s == "FULL_SHARD" || s == "1") l.reshard_after_forward = true;
  else if (s == "SHARD_GRAD_OP" || s == "2") l.reshard_after_forward = false;
  else if (s == "NO_SHARD" || s == "3") l.sharding = Sharding::none, l.zero_stage = 0, l.single_on_one_gpu = true;
  else if (s == "HYBRID_SHARD" || s == "4") l.hybrid = true;
  else if (s == "_HYBRID_SHARD_ZERO2" || s == "HYBRID_SHARD_ZERO2" || s == "5")
    r.unmodelled(key, v, "hybrid sharding with SHARD_GRAD_OP inside the node is not modelled");
  else r.unmodelled(key, v, "not a sharding strategy (FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD)");
  l.origin = r.at(key);
}

// An fsdp_config (accelerate, axolotl, TrainingArguments): keys with or without the fsdp_ prefix.
void read_fsdp_config(FileReader& r, ImportedLayout& l, const Json& config, const std::string& key) {
  r.object(config, key);
  for (auto it = config.begin(); it != config.end(); ++it) {
    const std::string sub = key + "." + it.key();
    std::string k = it.key();
    if (starts_with(k, "fsdp_")) k = k.substr(5);
    const Json& v = *it;
    if (v.is_null()) continue;
    if (k == "version") {
      r.set("fsdp_version", v, sub);
    } else if (k == "sharding_strategy") {
      read_sharding_strategy(r, l, v, sub);
    } else if (k == "reshard_after_forward") {
      if (v.is_boolean()) l.reshard_after_forward = v.get<bool>(), l.origin = r.at(sub);
      else read_sharding_strategy(r, l, v, sub);  // accelerate's FSDP-1 writes the strategy here
    } else if (k == "offload_params") {
      l.offload_optimizer = l.offload_params = r.boolean(v, sub);
    } else if (k == "activation_checkpointing") {
      r.set("checkpointing", r.boolean(v, sub) ? "full" : "none", sub, v);
    } else if (k == "state_dict_type") {
      // torch.distributed.fsdp.StateDictType by name or number (accelerate's FSDP_STATE_DICT_TYPE).
      std::string t = v.is_number_integer() ? std::to_string(v.get<int64_t>()) : r.text(v, sub);
      for (char& c : t) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
      if (t == "FULL_STATE_DICT" || t == "1") r.set("state_dict", "full", sub, v);
      else if (t == "LOCAL_STATE_DICT" || t == "2") r.set("state_dict", "local", sub, v);
      else if (t == "SHARDED_STATE_DICT" || t == "3") r.set("state_dict", "sharded", sub, v);
      else r.unmodelled(sub, v, "not a state dict type (FULL_STATE_DICT, LOCAL_STATE_DICT, SHARDED_STATE_DICT)");
    } else {
      r.ignore(sub);
    }
  }
}

// The HF Trainer's fsdp option: "full_shard auto_wrap" or a list of the words.
void read_fsdp_option(FileReader& r, ImportedLayout& l, const Json& v, const std::string& key, bool& on) {
  std::vector<std::string> words;
  if (v.is_string()) {
    std::istringstream in(v.get<std::string>());
    for (std::string w; in >> w;) words.push_back(w);
  } else if (v.is_array()) {
    for (const auto& w : v) words.push_back(r.text(w, key));
  } else if (v.is_boolean()) {
    if (v.get<bool>()) words.push_back("full_shard");
  } else {
    fail_input(r.at(key) + ": expected FSDP options (full_shard auto_wrap), got " + v.dump());
  }
  for (const auto& w : words) {
    const std::string s = lower(w);
    on = true;
    if (s == "full_shard") l.reshard_after_forward = true;
    else if (s == "shard_grad_op") l.reshard_after_forward = false;
    else if (s == "hybrid_shard") l.hybrid = true;
    else if (s == "no_shard") l.sharding = Sharding::none, l.zero_stage = 0;
    else if (s == "offload") l.offload_optimizer = l.offload_params = true;
    else if (s == "auto_wrap") continue;
    else r.unmodelled(key, v, "'" + w + "' is not modelled (full_shard, shard_grad_op, hybrid_shard, no_shard, offload, auto_wrap)");
  }
  if (words.empty()) on = false;
  l.origin = r.at(key);
}

// LoRA target modules as PEFT takes them: a list, "all-linear" or a comma string.
Json lora_targets(FileReader& r, const Json& v, const std::string& key) {
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    if (s == "all" || s == "all-linear" || s == "all_linear") return "all-linear";
    return s;
  }
  if (!v.is_array()) fail_input(r.at(key) + ": expected a list of module names, got " + v.dump());
  return v;
}

// max_steps > 0 decides the job's length over the epochs (transformers Trainer: "overrides num_train_epochs").
bool has_max_steps(const Json& j) {
  return j.contains("max_steps") && j.at("max_steps").is_number() && j.at("max_steps").get<double>() > 0;
}

void read_epochs_unless_steps(FileReader& r, const Json& j, const Json& v, const std::string& key) {
  if (has_max_steps(j)) r.note(r.at(key) + " " + shown(v) + ": max_steps decides the job's length (it overrides the epochs)");
  else read_epochs(r, v, key);
}

void refuse_true(FileReader& r, const Json& j, const char* key, const std::string& why) {
  if (j.contains(key) && !j.at(key).is_null() && j.at(key) != false && !(j.at(key).is_array() && j.at(key).empty()))
    r.unmodelled(key, j.at(key), why);
}

// ---------------------------------------------------------------------------------------------
// DeepSpeed config JSON (https://www.deepspeed.ai/docs/config-json/).

// ZeRO's stage with its offloads (a DeepSpeed config's zero_optimization, accelerate's deepspeed_config).
ImportedLayout zero_layout(FileReader& r, int stage, const std::string& opt_device, const std::string& param_device,
                           const std::string& stage_key, const std::string& opt_key, const std::string& param_key) {
  for (const auto& [key, device] : {std::pair<std::string, std::string>{opt_key, opt_device}, {param_key, param_device}})
    if (device != "none" && device != "cpu")
      r.unmodelled(key, device, device == "nvme" ? "NVMe offload is not modelled (cpu is)" : "not a device (none, cpu, nvme)");
  const bool off_opt = opt_device == "cpu", off_param = param_device == "cpu";
  if (off_param && stage < 3)
    r.unmodelled(param_key, "cpu", "parameter offload needs ZeRO stage 3 (" + stage_key.substr(stage_key.rfind('.') + 1) + " " +
                                      std::to_string(stage) + ")");
  if (off_param && !off_opt)
    r.unmodelled(param_key, "cpu",
                 "parameters offloaded without the optimizer states are not modelled (ftplan offloads parameters with "
                 "the optimizer states)");
  if (off_opt && stage == 0) r.unmodelled(opt_key, "cpu", "optimizer offload needs ZeRO stage 1, 2 or 3 (stage 0)");
  ImportedLayout l;
  l.sharding = stage == 0 ? Sharding::none : Sharding::zero;
  l.zero_stage = stage;
  l.offload_optimizer = off_opt;
  l.offload_params = off_param;
  l.single_on_one_gpu = stage == 0;
  l.origin = r.at(stage_key);
  return l;
}

void Importer::read_deepspeed(FileReader& r, const Json& j) {
  std::optional<bool> bf16, fp16;
  bool autocast = false, grad_accum_fp32 = false, bf16_master = false, bf16_states = false;
  std::string bf16_key = "bf16.enabled", fp16_key = "fp16.enabled";
  ImportedLayout l;
  l.origin = r.at("zero_optimization.stage");
  int stage = 0;
  std::string offload_opt_device = "none", offload_param_device = "none";
  bool has_zero = false;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string key = it.key();
    const Json& v = *it;
    if (v.is_null()) continue;
    if (key == "train_micro_batch_size_per_gpu") {
      if (v == "auto") r.automatic(key, "micro_batch");
      else r.set("micro_batch", v, key);
    } else if (key == "gradient_accumulation_steps") {
      if (v == "auto") r.automatic(key, "grad_accum");
      else r.set("grad_accum", v, key);
    } else if (key == "train_batch_size") {
      if (v == "auto") {
        r.automatic(key, "train_batch_size");
      } else {
        imp.train_batch_size = r.integer(v, key, 1, int64_t(1) << 40);
        imp.train_batch_size_origin = r.at(key);
      }
    } else if (key == "bf16" || key == "bfloat16" || key == "fp16") {
      auto& flag = key == "fp16" ? fp16 : bf16;
      for (auto sub = r.object(v, key).begin(); sub != v.end(); ++sub) {
        const std::string name = key + "." + sub.key();
        if (key != "fp16" && (sub.key() == "bf16_master_weights_and_grads" || sub.key() == "bf16_optimizer_states")) {
          (sub.key() == "bf16_optimizer_states" ? bf16_states : bf16_master) = r.boolean(*sub, name);
        } else if (sub.key() != "enabled") {
          r.ignore(name);
        } else if (*sub == "auto") {
          r.automatic(name, "precision");
        } else {
          flag = r.boolean(*sub, name);
          (key == "fp16" ? fp16_key : bf16_key) = name;
        }
      }
    } else if (key == "data_types") {
      for (auto sub = r.object(v, key).begin(); sub != v.end(); ++sub) {
        if (sub.key() == "grad_accum_dtype") grad_accum_fp32 = lower(r.text(*sub, key + ".grad_accum_dtype")) == "fp32";
        else r.ignore(key + "." + sub.key());
      }
    } else if (key == "torch_autocast") {
      for (auto sub = r.object(v, key).begin(); sub != v.end(); ++sub) {
        if (sub.key() == "enabled") autocast = r.boolean(*sub, key + ".enabled");
        else r.ignore(key + "." + sub.key());
      }
    } else if (key == "zero_optimization") {
      has_zero = true;
      for (auto sub = r.object(v, key).begin(); sub != v.end(); ++sub) {
        const std::string name = key + "." + sub.key();
        if (sub->is_null()) continue;
        if (sub.key() == "stage") {
          stage = static_cast<int>(r.integer(*sub, name, 0, 3));
        } else if (sub.key() == "offload_optimizer" || sub.key() == "offload_param") {
          auto& device = sub.key() == "offload_optimizer" ? offload_opt_device : offload_param_device;
          for (auto o = r.object(*sub, name).begin(); o != sub->end(); ++o) {
            if (o.key() == "device") device = lower(r.text(*o, name + ".device"));
            else r.ignore(name + "." + o.key());
          }
        } else if (sub.key() == "cpu_offload") {  // DeepSpeed before 0.3.x
          if (r.boolean(*sub, name)) offload_opt_device = "cpu";
        } else {
          r.ignore(name);
        }
      }
    } else if (key == "optimizer") {
      for (auto sub = r.object(v, key).begin(); sub != v.end(); ++sub) {
        const std::string name = key + "." + sub.key();
        if (sub.key() == "type") {
          const std::string t = lower(r.text(*sub, name));
          if (t == "adam" || t == "adamw") r.set("optimizer", "adamw", name, *sub);  // adam_w_mode is on by default
          else r.unmodelled(name, *sub, "not modelled (Adam, AdamW)");
        } else if (sub.key() == "params" && sub->is_object()) {
          for (auto p = sub->begin(); p != sub->end(); ++p) {
            const std::string pname = name + "." + p.key();
            if (p.key() == "lr" && *p == "auto") r.automatic(pname, "learning_rate");
            else if (p.key() == "lr") r.set("learning_rate", *p, pname);
            else r.ignore(pname);
          }
        } else {
          r.ignore(name);
        }
      }
    } else if (key == "tensor_parallel") {
      for (auto sub = r.object(v, key).begin(); sub != v.end(); ++sub) {
        const std::string name = key + "." + sub.key();
        if (sub.key() == "autotp_size" && r.integer(*sub, name, 1, 1 << 20) > 1)
          r.unmodelled(name, *sub, "DeepSpeed AutoTP training is not modelled (the deepspeed profile has no tensor parallelism)");
        else if (sub.key() != "autotp_size") r.ignore(name);
      }
    } else if (key == "sequence_parallel_size") {
      if (r.integer(v, key, 1, 1 << 20) > 1) r.unmodelled(key, v, "DeepSpeed Ulysses sequence parallelism is not modelled");
    } else {
      r.ignore(key);
    }
  }
  // Precision (DeepSpeed: bf16 or fp16 weights with fp32 master weights and moments; torch_autocast: fp32 weights).
  if (bf16_master != bf16_states)
    r.unmodelled("bf16.bf16_master_weights_and_grads", bf16_master,
                 "bf16 master weights without bf16 optimizer states (or the reverse) is not modelled");
  if (autocast && !(bf16 && *bf16)) {
    // torch.autocast over fp32 weights (DeepSpeed's torch_autocast): the amp convention.
    r.set("precision", "amp", "torch_autocast.enabled", true);
    r.set_precision_mode("bf16", "torch_autocast.enabled", true);
  } else if (bf16 && *bf16) {
    r.set_precision_mode("bf16", bf16_key, true);
    if (bf16_master) r.set("precision", "bf16", "bf16.bf16_master_weights_and_grads", true);
    else if (grad_accum_fp32) r.set("precision", "mixed-fp32-grads", "data_types.grad_accum_dtype", "fp32");
  } else if (fp16 && *fp16) {
    r.set_precision_mode("fp16", fp16_key, true);
    if (grad_accum_fp32) r.set("precision", "mixed-fp32-grads", "data_types.grad_accum_dtype", "fp32");
  } else if ((bf16 && !*bf16) || (fp16 && !*fp16)) {
    r.set_precision_mode("fp32", bf16 ? bf16_key : fp16_key, false);
  }
  // The layout: ZeRO's stage, offload where the stage allows it.
  l = zero_layout(r, stage, offload_opt_device, offload_param_device, "zero_optimization.stage",
                  "zero_optimization.offload_optimizer", "zero_optimization.offload_param");
  if (!has_zero) l.origin = r.at("zero_optimization (absent: stage 0)");
  r.set_layout(l);
  r.set_framework("deepspeed", has_zero ? "zero_optimization" : "(a DeepSpeed config)");
}

// ---------------------------------------------------------------------------------------------
// accelerate config YAML (accelerate config / examples/config_yaml_templates).

void read_accelerate(Importer& all, FileReader& r, const Json& j) {
  (void)all;
  std::optional<int64_t> processes, machines;
  ImportedLayout l;
  std::string type;
  bool has_parallelism = false;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string key = it.key();
    const Json& v = *it;
    if (v.is_null()) continue;
    if (key == "distributed_type") {
      type = r.text(v, key);
      for (char& c : type) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
      if (type != "NO" && type != "MULTI_GPU" && type != "FSDP" && type != "DEEPSPEED")
        r.unmodelled(key, v, "not modelled (NO, MULTI_GPU, FSDP, DEEPSPEED)");
    } else if (key == "num_processes") {
      processes = r.integer(v, key, 1, 1048576);
      r.set("gpus", v, key);
    } else if (key == "num_machines") {
      machines = r.integer(v, key, 1, 65536);
      if (*machines > 1) r.set("nodes", v, key);  // one machine says no more than num_processes
    } else if (key == "mixed_precision") {
      const std::string m = lower(r.text(v, key));
      if (m == "no") r.set_precision_mode("fp32", key, v);
      else if (m == "bf16" || m == "fp16") r.set_precision_mode(m, key, v);
      else r.unmodelled(key, v, "not modelled (no, bf16, fp16)");
    } else if (key == "use_cpu") {
      if (r.boolean(v, key)) r.unmodelled(key, v, "CPU training: give --gpu cpu instead");
    } else if (key == "fsdp_config" || key == "deepspeed_config" || key == "parallelism_config") {
      r.object(v, key);  // read below, once distributed_type is known
    } else {
      r.ignore(key);
    }
  }
  if (machines && *machines > 1 && processes) {
    if (*processes % *machines != 0)
      fail_input(r.at("num_processes") + " " + std::to_string(*processes) + " is not a multiple of " + r.at("num_machines") +
                 " " + std::to_string(*machines));
    r.set("gpus_per_node", *processes / *machines, "num_processes / num_machines", *processes / *machines);
  }
  const auto section = [&](const char* key) -> const Json* {
    return j.contains(key) && j.at(key).is_object() ? &j.at(key) : nullptr;
  };
  if (const Json* pc = section("parallelism_config")) {
    for (auto it = pc->begin(); it != pc->end(); ++it) {
      const std::string name = std::string("parallelism_config.") + it.key();
      std::string k = it.key();
      if (starts_with(k, "parallelism_config_")) k = k.substr(19);
      const Json& v = *it;
      if (v.is_null()) continue;
      has_parallelism = true;
      if (k == "dp_replicate_size") l.dp_replicate = r.integer(v, name, 1, 1048576);
      else if (k == "dp_shard_size") l.dp_shard = r.integer(v, name, 1, 1048576);
      else if (k == "tp_size") l.tp = r.integer(v, name, 1, 1048576);
      else if (k == "cp_size") l.cp = r.integer(v, name, 1, 1048576);
      else if (k == "cp_comm_strategy") {
        const std::string s = lower(r.text(v, name));
        if (s == "allgather" || s == "all_gather") l.cp_mode = ContextParallel::all_gather;
        else r.unmodelled(name, v, "not modelled (allgather)");
      } else if (k == "sp_size") {
        if (r.integer(v, name, 1, 1048576) > 1) r.unmodelled(name, v, "Ulysses sequence parallelism is not modelled");
      } else {
        r.ignore(name);
      }
    }
  }
  if (type == "DEEPSPEED") {
    r.set_framework("deepspeed", "distributed_type");
    if (const Json* ds = section("deepspeed_config")) {
      std::optional<int64_t> stage;
      std::string opt = "none", param = "none";
      for (auto it = ds->begin(); it != ds->end(); ++it) {
        const std::string name = std::string("deepspeed_config.") + it.key();
        const Json& v = *it;
        if (v.is_null()) continue;
        if (it.key() == "deepspeed_config_file") r.named_deepspeed(v, name);
        else if (it.key() == "zero_stage") stage = r.integer(v, name, 0, 3);
        else if (it.key() == "offload_optimizer_device") opt = lower(r.text(v, name));
        else if (it.key() == "offload_param_device") param = lower(r.text(v, name));
        else if (it.key() == "gradient_accumulation_steps") r.set("grad_accum", v, name);
        else r.ignore(name);
      }
      if (stage) r.set_layout(zero_layout(r, static_cast<int>(*stage), opt, param, "deepspeed_config.zero_stage",
                                          "deepspeed_config.offload_optimizer_device", "deepspeed_config.offload_param_device"));
    }
  } else if (type == "FSDP") {
    r.set_framework("fsdp", "distributed_type");
    l.sharding = Sharding::fsdp;
    l.zero_stage = 3;
    l.origin = r.at("distributed_type");
    if (const Json* f = section("fsdp_config")) read_fsdp_config(r, l, *f, "fsdp_config");
    r.set_layout(l);
  } else if (type == "MULTI_GPU" || type == "NO") {
    l.origin = r.at("distributed_type");
    l.single_on_one_gpu = true;
    if (has_parallelism && (l.tp > 1 || l.cp > 1 || l.dp_shard > 1))
      r.unmodelled("parallelism_config", "tp/cp/dp_shard", "tensor, context or sharded parallelism needs distributed_type FSDP");
    if (type == "NO") r.set("gpus", 1, "distributed_type", "NO");
    r.set_layout(l);
  }
  for (const char* key : {"fsdp_config", "deepspeed_config"})
    if (section(key) && !((type == "FSDP" && std::string(key) == "fsdp_config") || (type == "DEEPSPEED" && std::string(key) == "deepspeed_config")))
      r.ignore(std::string(key) + " (distributed_type " + (type.empty() ? "absent" : type) + ")");
}

// ---------------------------------------------------------------------------------------------
// Hugging Face TrainingArguments (+ TRL SFTConfig / ModelConfig), and what axolotl and LLaMA-Factory
// share with them.

struct HfState {
  ImportedLayout fsdp = fsdp_layout("");
  bool fsdp_on = false;
  bool deepspeed = false;
};

// The TrainingArguments keys; true when `key` was one.
bool read_hf_key(FileReader& r, HfState& st, const std::string& key, const Json& v) {
  if (key == "per_device_train_batch_size") r.set("micro_batch", v, key);
  else if (key == "gradient_accumulation_steps") r.set("grad_accum", v, key);
  else if (key == "learning_rate") r.set("learning_rate", v, key);
  else if (key == "seed") r.set("seed", v, key);
  else if (key == "max_steps") r.set_max_steps(v, key, false);
  else if (key == "gradient_checkpointing") r.set("checkpointing", r.boolean(v, key) ? "full" : "none", key, v);
  else if (key == "optim") read_optimizer_name(r, v, key);
  else if (key == "torch_compile") r.set("compile", r.boolean(v, key), key);
  else if (key == "use_liger_kernel") { if (r.boolean(v, key)) r.set("loss", "fused-linear", key, v); }
  else if (key == "deepspeed") { st.deepspeed = true; r.named_deepspeed(v, key); }
  else if (key == "fsdp") read_fsdp_option(r, st.fsdp, v, key, st.fsdp_on);
  else if (key == "fsdp_config") { if (v.is_object()) read_fsdp_config(r, st.fsdp, v, key); else r.ignore(key); }
  else if (key == "attn_implementation") {
    const std::string a = lower(r.text(v, key));
    r.set("attention", a == "eager" ? "eager" : "fused", key, v);
  } else return false;
  return true;
}

// Epochs written as a float (3.0); a fraction of an epoch is not a job ftplan plans.
void read_epochs(FileReader& r, const Json& v, const std::string& key) {
  if (v.is_number() && std::isfinite(v.get<double>()) && std::floor(v.get<double>()) != v.get<double>())
    r.unmodelled(key, v, "a fraction of an epoch is not modelled (a whole number of epochs, or max_steps)");
  r.set("epochs", v, key);  // the field table checks the type and the range
}

// The layout a TrainingArguments-style file gives: DeepSpeed's (read from its config), FSDP's, or
// DDP over every GPU when it names neither (the Trainer's default under torchrun / accelerate).
void finish_hf_layout(FileReader& r, HfState& st, const std::string& fsdp_key) {
  if (st.fsdp_on && st.deepspeed) fail_input(r.at("deepspeed") + " and " + r.at(fsdp_key) + ": give one");
  if (st.fsdp_on) {
    if (st.fsdp.sharding == Sharding::fsdp) r.set_framework("fsdp", fsdp_key);
    if (st.fsdp.origin.empty()) st.fsdp.origin = r.at(fsdp_key);
    r.set_layout(st.fsdp);
  } else if (!st.deepspeed) {
    ImportedLayout ddp;
    ddp.explicit_layout = false;
    ddp.single_on_one_gpu = true;
    ddp.origin = r.at("(no deepspeed or fsdp: DDP)");
    r.set_layout(ddp);
  }
}

void read_hf_trainer(FileReader& r, const Json& j) {
  HfState st;
  bool peft = j.contains("use_peft") && !j.at("use_peft").is_null() && r.boolean(j.at("use_peft"), "use_peft");
  const bool four_bit = j.contains("load_in_4bit") && !j.at("load_in_4bit").is_null() && r.boolean(j.at("load_in_4bit"), "load_in_4bit");
  refuse_true(r, j, "load_in_8bit", "an 8-bit (LLM.int8) base is not a job setting: plan it from a model config whose "
                                   "quantization_config says load_in_8bit (--model PATH)");
  r.set("method", peft ? (four_bit ? "qlora" : "lora") : "full", j.contains("use_peft") ? "use_peft" : "use_peft (absent: full fine-tuning)",
        j.value("use_peft", Json(nullptr)));
  if (four_bit && !peft) r.unmodelled("load_in_4bit", true, "a 4-bit base needs LoRA (use_peft: true)");
  read_bf16_fp16(r, j);
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string key = it.key();
    const Json& v = *it;
    if (v.is_null() || key == "bf16" || key == "fp16" || key == "use_peft" || key == "load_in_4bit" || key == "load_in_8bit") continue;
    if (read_hf_key(r, st, key, v)) continue;
    if (key == "model_name_or_path") r.set_model(r.text(v, key), key);
    else if (key == "num_train_epochs") read_epochs_unless_steps(r, j, v, key);
    else if (key == "max_seq_length" || key == "max_length") r.set("seq_len", v, key);
    else if (key == "packing") r.set("packing", r.boolean(v, key), key);
    else if (peft && key == "lora_r") r.set("lora.rank", v, key);
    else if (peft && key == "lora_alpha") r.set("lora.alpha", v, key);
    else if (peft && key == "lora_dropout") r.set("lora.dropout", v, key);
    else if (peft && key == "lora_target_modules") r.set("lora.targets", lora_targets(r, v, key), key, v);
    else if (key == "lora_modules_to_save" || key == "use_dora") refuse_true(r, j, key.c_str(), "not modelled (LoRA on the block linears only)");
    else r.ignore(key);
  }
  finish_hf_layout(r, st, "fsdp");
  r.set_framework("hf", "(Hugging Face Trainer)");
}

// ---------------------------------------------------------------------------------------------
// axolotl YAML (src/axolotl/utils/schemas/config.py).

void read_axolotl(FileReader& r, const Json& j) {
  HfState st;
  const auto get = [&](const char* k) -> Json { return j.contains(k) ? j.at(k) : Json(nullptr); };
  const Json adapter = get("adapter");
  std::string method = "full";
  if (!adapter.is_null()) {
    const std::string a = lower(r.text(adapter, "adapter"));
    if (a == "lora" || a == "qlora") method = a;
    else r.unmodelled("adapter", adapter, "not modelled (lora, qlora; none for full fine-tuning)");
  }
  if (!get("load_in_4bit").is_null() && r.boolean(get("load_in_4bit"), "load_in_4bit")) {
    if (method == "full") r.unmodelled("load_in_4bit", true, "a 4-bit base needs an adapter (adapter: qlora)");
    method = "qlora";
  }
  refuse_true(r, j, "load_in_8bit", "an 8-bit (LLM.int8) base is not a job setting: plan it from a model config whose "
                                   "quantization_config says load_in_8bit (--model PATH)");
  r.set("method", method, adapter.is_null() ? "adapter (absent: full fine-tuning)" : "adapter", adapter);
  const bool lora = method != "full";
  read_bf16_fp16(r, j);
  ImportedLayout nd;  // N-D parallelism degrees
  bool nd_given = false;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string key = it.key();
    const Json& v = *it;
    if (v.is_null() || key == "adapter" || key == "load_in_4bit" || key == "load_in_8bit" || key == "bf16" || key == "fp16") continue;
    if (key == "base_model") r.set_model(r.text(v, key), key);
    else if (key == "sequence_len") r.set("seq_len", v, key);
    else if (key == "sample_packing") r.set("packing", r.boolean(v, key), key);
    else if (key == "micro_batch_size") r.set("micro_batch", v, key);
    else if (key == "gradient_accumulation_steps") r.set("grad_accum", v, key);
    else if (key == "num_epochs") read_epochs_unless_steps(r, j, v, key); else if (key == "max_steps") r.set_max_steps(v, key, false);
    else if (key == "learning_rate") r.set("learning_rate", v, key);
    else if (key == "seed") r.set("seed", v, key);
    else if (key == "optimizer") read_optimizer_name(r, v, key);
    else if (key == "gradient_checkpointing") {
      if (v.is_string()) r.unmodelled(key, v, "offloaded checkpoints are not modelled (true or false)");
      r.set("checkpointing", r.boolean(v, key) ? "full" : "none", key, v);
    } else if (key == "activation_offloading") {
      if (v.is_string() && v != "legacy") r.unmodelled(key, v, "not modelled (true, legacy)");
      r.set("activation_offload", v.is_string() ? true : r.boolean(v, key), key, v);
    } else if (lora && key == "lora_r") r.set("lora.rank", v, key);
    else if (lora && key == "lora_alpha") r.set("lora.alpha", v, key);
    else if (lora && key == "lora_dropout") r.set("lora.dropout", v, key);
    else if (lora && key == "lora_target_modules") r.set("lora.targets", lora_targets(r, v, key), key, v);
    else if (lora && key == "lora_target_linear") { if (r.boolean(v, key)) r.set("lora.targets", "all-linear", key, v); }
    else if (key == "lora_modules_to_save" || key == "peft_use_dora" || key == "relora" || key == "peft_layers_to_transform")
      refuse_true(r, j, key.c_str(), "not modelled (LoRA on the block linears only)");
    else if (key == "flash_attention" || key == "sdp_attention" || key == "flex_attention") { if (r.boolean(v, key)) r.set("attention", "fused", key, v); }
    else if (key == "eager_attention") { if (r.boolean(v, key)) r.set("attention", "eager", key, v); }
    else if (key == "attn_implementation") {
      const std::string a = lower(r.text(v, key));
      r.set("attention", a == "eager" ? "eager" : "fused", key, v);
    } else if (key == "torch_compile") { if (v != "auto") r.set("compile", r.boolean(v, key), key); }
    else if (key == "liger_fused_linear_cross_entropy" || key == "cut_cross_entropy") {
      if (r.boolean(v, key)) r.set("loss", "fused-linear", key, v);
    } else if (key == "chunked_cross_entropy") { if (r.boolean(v, key)) r.set("loss", "chunked", key, v); }
    else if (key == "deepspeed") { st.deepspeed = true; r.named_deepspeed(v, key); }
    else if (key == "fsdp") read_fsdp_option(r, st.fsdp, v, key, st.fsdp_on);
    else if (key == "fsdp_config") { read_fsdp_config(r, st.fsdp, v, key); st.fsdp_on = true; if (st.fsdp.origin.empty()) st.fsdp.origin = r.at(key); }
    else if (key == "fsdp_version") r.set("fsdp_version", v, key);
    else if (key == "tensor_parallel_size") {
      if (r.integer(v, key, 1, 1048576) > 1)
        r.unmodelled(key, v, "axolotl runs tensor parallelism through DeepSpeed AutoTP, which ftplan does not model");
    } else if (key == "context_parallel_size" || key == "sequence_parallel_degree") { nd.cp = r.integer(v, key, 1, 1048576); nd_given = true; nd.origin = r.at(key); }
    else if (key == "dp_shard_size") { nd.dp_shard = r.integer(v, key, 1, 1048576); nd_given = true; nd.origin = r.at(key); }
    else if (key == "dp_replicate_size") { nd.dp_replicate = r.integer(v, key, 1, 1048576); nd_given = true; nd.origin = r.at(key); }
    else r.ignore(key);
  }
  if (nd_given) {
    // N-D parallelism composes with FSDP-2 (axolotl's docs/nd_parallelism.qmd): the degrees on the FSDP layout.
    if (!st.fsdp_on && nd.dp_shard > 1) st.fsdp_on = true;
    ImportedLayout& l = st.fsdp;
    l.cp = nd.cp;
    l.cp_mode = ContextParallel::ring;  // ring-flash-attn
    l.dp_shard = nd.dp_shard;
    l.dp_replicate = nd.dp_replicate;
    if (!st.fsdp_on) {  // context parallelism over replicas
      l.sharding = Sharding::none;
      l.zero_stage = 0;
      st.fsdp_on = true;
    }
    if (l.origin.empty()) l.origin = nd.origin;
  }
  finish_hf_layout(r, st, "fsdp");
  r.set_framework("hf", "(axolotl runs the Hugging Face Trainer)");
}

// ---------------------------------------------------------------------------------------------
// LLaMA-Factory YAML (src/llamafactory/hparams/*.py; TrainingArguments for the rest).

void read_llamafactory(FileReader& r, const Json& j) {
  HfState st;
  const auto get = [&](const char* k) -> Json { return j.contains(k) ? j.at(k) : Json(nullptr); };
  // finetuning_type defaults to lora (hparams/finetuning_args.py).
  const Json ft = get("finetuning_type");
  const std::string type = ft.is_null() ? "lora" : lower(r.text(ft, "finetuning_type"));
  if (type != "lora" && type != "full")
    r.unmodelled("finetuning_type", ft, "not modelled (lora, full)");
  std::string method = type;
  const Json qbit = get("quantization_bit");
  if (!qbit.is_null()) {
    const int64_t bits = r.integer(qbit, "quantization_bit", 2, 8);
    if (bits != 4) r.unmodelled("quantization_bit", qbit, "a " + std::to_string(bits) + "-bit base is not modelled (4-bit bitsandbytes is)");
    if (type != "lora") r.unmodelled("quantization_bit", qbit, "a quantized base needs finetuning_type lora");
    method = "qlora";
  }
  r.set("method", method, ft.is_null() ? "finetuning_type (absent: lora)" : "finetuning_type", ft);
  const Json stage = get("stage");
  if (!stage.is_null() && lower(r.text(stage, "stage")) != "sft" && lower(r.text(stage, "stage")) != "pt")
    r.unmodelled("stage", stage, "not modelled (sft, pt: one model's forward and backward; dpo/kto/ppo/rm run more)");
  read_bf16_fp16(r, j);
  // Gradient checkpointing is on unless disabled (model/model_utils/checkpointing.py).
  if (get("disable_gradient_checkpointing").is_null())
    r.set("checkpointing", "full", "disable_gradient_checkpointing (absent: LLaMA-Factory checkpoints)", nullptr);
  int64_t datasets = 0;
  if (get("dataset").is_string()) {
    std::istringstream in(get("dataset").get<std::string>());
    for (std::string d; std::getline(in, d, ',');) datasets += d.find_first_not_of(" ") != std::string::npos;
  }
  const bool lora = method != "full";
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string key = it.key();
    const Json& v = *it;
    if (v.is_null() || key == "finetuning_type" || key == "quantization_bit" || key == "stage" || key == "bf16" || key == "fp16") continue;
    if (read_hf_key(r, st, key, v)) continue;
    if (key == "model_name_or_path") r.set_model(r.text(v, key), key);
    else if (key == "num_train_epochs") read_epochs_unless_steps(r, j, v, key);
    else if (key == "cutoff_len") r.set("seq_len", v, key);
    else if (key == "packing" || key == "neat_packing") { if (r.boolean(v, key)) r.set("packing", true, key); }
    else if (key == "max_samples") {
      const int64_t n = r.integer(v, key, 1, int64_t(1) << 40);
      r.set("dataset.rows", n * std::max<int64_t>(1, datasets), key + " x datasets", v);
      r.note(r.at(key) + " " + std::to_string(n) + " x " + std::to_string(std::max<int64_t>(1, datasets)) +
             " dataset(s): at most " + std::to_string(n * std::max<int64_t>(1, datasets)) + " rows (a dataset may hold fewer)");
    } else if (key == "disable_gradient_checkpointing") r.set("checkpointing", r.boolean(v, key) ? "none" : "full", key, v);
    else if (key == "enable_liger_kernel") { if (r.boolean(v, key)) r.set("loss", "fused-linear", key, v); }
    else if (key == "flash_attn") {
      const std::string a = lower(r.text(v, key));
      r.set("attention", a == "disabled" ? "eager" : "fused", key, v);
    } else if (key == "pure_bf16") { if (r.boolean(v, key)) r.set("precision", "bf16", key, v); }
    else if (key == "quantization_method") {
      if (lower(r.text(v, key)) != "bnb" && lower(r.text(v, key)) != "bitsandbytes") r.unmodelled(key, v, "not modelled (bnb)");
    } else if (lora && key == "lora_rank") r.set("lora.rank", v, key);
    else if (lora && key == "lora_alpha") r.set("lora.alpha", v, key);
    else if (lora && key == "lora_dropout") r.set("lora.dropout", v, key);
    else if (lora && key == "lora_target") r.set("lora.targets", lora_targets(r, v, key), key, v);
    else if (key == "use_dora" || key == "additional_target" || key == "use_unsloth" || key == "use_galore" ||
             key == "use_badam" || key == "use_apollo" || key == "pissa_init")
      refuse_true(r, j, key.c_str(), "not modelled");
    else r.ignore(key);
  }
  // LoRA alpha defaults to twice the rank (hparams/finetuning_args.py: lora_alpha = lora_rank * 2).
  if (lora && get("lora_alpha").is_null()) {
    const int64_t rank = get("lora_rank").is_null() ? 8 : r.integer(get("lora_rank"), "lora_rank", 1, 65536);
    r.set("lora.alpha", 2 * rank, "lora_alpha (absent: 2 x lora_rank)", nullptr);
    if (get("lora_rank").is_null()) r.set("lora.rank", 8, "lora_rank (absent: 8)", nullptr);
  }
  finish_hf_layout(r, st, "fsdp");
  r.set_framework("hf", "(LLaMA-Factory runs the Hugging Face Trainer)");
}

// ---------------------------------------------------------------------------------------------
// torchtune recipe YAML (recipes/configs/**).

void read_torchtune(FileReader& r, const Json& j) {
  ImportedLayout l = fsdp_layout(r.at("(distributed recipes shard with FSDP-2)"));
  l.single_on_one_gpu = true;
  bool dims = false;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string key = it.key();
    const Json& v = *it;
    if (v.is_null()) continue;
    if (key == "model") {
      for (auto sub = r.object(v, key).begin(); sub != v.end(); ++sub) {
        const std::string name = "model." + sub.key();
        const Json& x = *sub;
        if (x.is_null()) continue;
        if (sub.key() == "_component_") {
          const std::string component = r.text(x, name);
          const auto m = model_for_torchtune_component(component);
          if (!m) {
            if (r.imp.unknown_model.empty()) r.imp.unknown_model = component, r.imp.unknown_model_origin = r.at(name);
            const std::string builder = component.substr(component.rfind('.') + 1);
            r.set("method", starts_with(builder, "qlora_") ? "qlora" : starts_with(builder, "lora_") ? "lora" : "full", name, x);
          } else {
            r.set("model", m->model, name, x);
            r.set("method", to_string(m->method), name, x);
          }
        } else if (sub.key() == "lora_attn_modules" || sub.key() == "apply_lora_to_mlp") {
          continue;  // below, together
        } else if (sub.key() == "apply_lora_to_output") {
          if (r.boolean(x, name)) r.unmodelled(name, x, "LoRA on the output head is not modelled");
        } else if (sub.key() == "lora_rank") r.set("lora.rank", x, name);
        else if (sub.key() == "lora_alpha") r.set("lora.alpha", x, name);
        else if (sub.key() == "lora_dropout") r.set("lora.dropout", x, name);
        else if (sub.key() == "use_dora") { if (r.boolean(x, name)) r.unmodelled(name, x, "DoRA is not modelled"); }
        else r.ignore(name);
      }
      // torchtune's names: q_proj, k_proj, v_proj, output_proj; apply_lora_to_mlp adapts w1, w2, w3.
      if (v.contains("lora_attn_modules") && !v.at("lora_attn_modules").is_null()) {
        Json targets = Json::array();
        const Json& mods = v.at("lora_attn_modules");
        if (!mods.is_array()) fail_input(r.at("model.lora_attn_modules") + ": expected a list, got " + mods.dump());
        for (const auto& m : mods) {
          const std::string s = r.text(m, "model.lora_attn_modules");
          if (s == "q_proj" || s == "k_proj" || s == "v_proj") targets.push_back(s);
          else if (s == "output_proj") targets.push_back("o_proj");
          else r.unmodelled("model.lora_attn_modules", s, "not a torchtune attention module (q_proj, k_proj, v_proj, output_proj)");
        }
        const bool mlp = v.contains("apply_lora_to_mlp") && !v.at("apply_lora_to_mlp").is_null() &&
                         r.boolean(v.at("apply_lora_to_mlp"), "model.apply_lora_to_mlp");
        if (mlp)
          for (const char* m : {"gate_proj", "up_proj", "down_proj"}) targets.push_back(m);
        r.set("lora.targets", targets, "model.lora_attn_modules + apply_lora_to_mlp", mods);
      }
    } else if (key == "tokenizer") {
      for (auto sub = r.object(v, key).begin(); sub != v.end(); ++sub) {
        if (sub.key() == "max_seq_len" && !sub->is_null()) r.set("seq_len", *sub, "tokenizer.max_seq_len");
        else if (sub.key() == "max_seq_len") r.note(r.at("tokenizer.max_seq_len") + " null: rows are not truncated; seq_len from --seq-len (default 2048)");
        else r.ignore("tokenizer." + sub.key());
      }
    } else if (key == "dataset") {
      if (v.is_object()) {
        for (auto sub = v.begin(); sub != v.end(); ++sub) {
          if (sub.key() == "packed" && !sub->is_null()) r.set("packing", r.boolean(*sub, "dataset.packed"), "dataset.packed");
          else r.ignore("dataset." + sub.key());
        }
      } else {
        r.ignore(key);
      }
    } else if (key == "batch_size") r.set("micro_batch", v, key);
    else if (key == "gradient_accumulation_steps") r.set("grad_accum", v, key);
    else if (key == "epochs") r.set("epochs", v, key);
    else if (key == "max_steps_per_epoch") r.set_max_steps(v, key, true);
    else if (key == "seed") r.set("seed", v, key);
    else if (key == "optimizer") {
      for (auto sub = r.object(v, key).begin(); sub != v.end(); ++sub) {
        const std::string name = "optimizer." + sub.key();
        if (sub.key() == "_component_") {
          const std::string c = r.text(*sub, name);
          const std::string cls = c.substr(c.rfind('.') + 1);
          if (cls == "AdamW" && starts_with(c, "torchao.")) r.set("optimizer", "adamw", name, *sub);
          else if (cls == "AdamW" || cls == "Adam") r.set("optimizer", "adamw", name, *sub);
          else if (cls == "AdamW8bit" || cls == "PagedAdamW8bit") r.set("optimizer", "adamw8bit", name, *sub);
          else if (cls == "PagedAdamW" || cls == "PagedAdamW32bit") r.set("optimizer", "adamw", name, *sub);
          else if (cls == "SGD") r.set("optimizer", "sgd", name, *sub);
          else r.unmodelled(name, *sub, "not modelled (AdamW, AdamW8bit, PagedAdamW, PagedAdamW8bit, SGD)");
          if (starts_with(cls, "Paged")) r.set("paged_optimizer", true, name, *sub);
        } else if (sub.key() == "lr") r.set("learning_rate", *sub, name);
        else r.ignore(name);
      }
    } else if (key == "loss") {
      for (auto sub = r.object(v, key).begin(); sub != v.end(); ++sub) {
        const std::string name = "loss." + sub.key();
        if (sub.key() != "_component_") { r.ignore(name); continue; }
        const std::string c = r.text(*sub, name);
        const std::string cls = c.substr(c.rfind('.') + 1);
        if (cls == "CEWithChunkedOutputLoss") r.set("loss", "chunked", name, *sub);
        else if (cls == "CrossEntropyLoss") r.set("loss", "full", name, *sub);
        else if (cls == "LinearCrossEntropyLoss") {
          r.set("loss", "chunked", name, *sub);
          r.note(r.at(name) + " LinearCrossEntropyLoss: planned as the torchtune profile's chunked loss "
                 "(CEWithChunkedOutputLoss, which the profile describes); LinearCrossEntropyLoss holds one chunk's "
                 "logits at a time, so this is an upper bound");
        } else r.unmodelled(name, *sub, "not modelled (CEWithChunkedOutputLoss, LinearCrossEntropyLoss, CrossEntropyLoss)");
      }
    } else if (key == "enable_activation_checkpointing") r.set("checkpointing", r.boolean(v, key) ? "full" : "none", key, v);
    else if (key == "enable_activation_offloading") r.set("activation_offload", r.boolean(v, key), key);
    else if (key == "dtype") {
      const std::string d = lower(r.text(v, key));
      if (d == "bf16") r.set("precision", "bf16", key, v), r.set_precision_mode("bf16", key, v);
      else if (d == "fp32") r.set("precision", "fp32", key, v), r.set_precision_mode("fp32", key, v);
      else r.unmodelled(key, v, "not modelled (bf16, fp32)");
    } else if (key == "compile") {
      r.set("compile", v.is_object() ? true : r.boolean(v, key), key, v);
    } else if (key == "optimizer_in_bwd") r.set("optimizer_in_backward", r.boolean(v, key), key);
    else if (key == "fsdp_cpu_offload") { l.offload_optimizer = l.offload_params = r.boolean(v, key); l.origin = r.at(key); }
    else if (key == "fsdp_reshard_after_forward") { l.reshard_after_forward = r.boolean(v, key); l.origin = r.at(key); }
    else if (key == "tensor_parallel_dim") { l.tp = r.integer(v, key, 1, 1048576); dims = true; l.origin = r.at(key); }
    else if (key == "context_parallel_dim") { l.cp = r.integer(v, key, 1, 1048576); dims = true; l.origin = r.at(key); }
    else if (key == "data_parallel_shard_dim") {
      const int64_t d = r.integer(v, key, -1, 1048576);
      if (d == 0) r.unmodelled(key, v, "expected -1 (the rest) or a degree");
      l.dp_shard = d < 0 ? 0 : d;
      dims = true;
    } else if (key == "data_parallel_replicate_dim") { l.dp_replicate = r.integer(v, key, 1, 1048576); dims = true; }
    else r.ignore(key);
  }
  if (dims) l.single_on_one_gpu = false;
  l.sequence_parallel = l.tp > 1;  // torchtune's TP plans shard the norms by sequence (base_llama_tp_plan)
  r.set_layout(l);
  r.set_framework("torchtune", "model._component_");
}

// ---------------------------------------------------------------------------------------------
// Launch scripts: torchrun's --nnodes/--nproc_per_node, sbatch's #SBATCH --nodes/--gpus-per-node.

// "--key=value" or "--key value" in a token list; "" when absent.
std::optional<std::string> option(const std::vector<std::string>& t, size_t& i, const std::vector<std::string>& names) {
  for (const auto& n : names) {
    if (t[i] == n && i + 1 < t.size()) return t[++i];
    if (starts_with(t[i], n + "=")) return t[i].substr(n.size() + 1);
  }
  return std::nullopt;
}

void read_launch_script(FileReader& r, const std::vector<std::string>& lines) {
  std::optional<int64_t> nodes, per_node;
  std::string nodes_key, per_node_key;
  const auto number = [&](const std::string& value, const std::string& key) -> std::optional<int64_t> {
    if (!value.empty() && value[0] == '$') {
      r.note(r.at(key) + " " + value + ": a variable, not read");
      return std::nullopt;
    }
    int64_t x = 0;
    if (!plain_integer(value, x)) fail_input(r.at(key) + ": expected a whole number, got '" + value + "'");
    return r.integer(Json(x), key, 1, 1048576);
  };
  for (const auto& line : lines) {
    std::istringstream in(line);
    std::vector<std::string> t;
    for (std::string w; in >> w;) t.push_back(w);
    if (t.empty()) continue;
    if (t[0] == "#SBATCH") {
      for (size_t i = 1; i < t.size(); ++i) {
        if (t[i] == "#" || starts_with(t[i], "#")) break;
        if (auto v = option(t, i, {"--nodes", "-N"})) {
          nodes = number(*v, "#SBATCH --nodes"), nodes_key = "#SBATCH --nodes";
        } else if (auto g = option(t, i, {"--gpus-per-node", "--gres"})) {
          const std::string value = g->substr(g->rfind(':') == std::string::npos ? 0 : g->rfind(':') + 1);
          per_node = number(value, "#SBATCH --gpus-per-node"), per_node_key = "#SBATCH --gpus-per-node";
        } else if (starts_with(t[i], "-")) {
          r.ignore("#SBATCH " + t[i].substr(0, t[i].find('=')));
        }
      }
      continue;
    }
    if (starts_with(t[0], "#")) continue;
    const auto run = std::find_if(t.begin(), t.end(), [](const std::string& w) { return w == "torchrun" || ends_with(w, "/torchrun"); });
    if (run == t.end()) continue;
    for (size_t i = static_cast<size_t>(run - t.begin()) + 1; i < t.size(); ++i) {
      if (!starts_with(t[i], "-")) break;  // the training script: torchrun's flags end here
      if (auto v = option(t, i, {"--nnodes"})) {
        if (v->find(':') != std::string::npos) r.unmodelled("torchrun --nnodes", *v, "elastic node ranges are not modelled");
        if (auto n = number(*v, "torchrun --nnodes")) nodes = n, nodes_key = "torchrun --nnodes";
      } else if (auto p = option(t, i, {"--nproc_per_node", "--nproc-per-node"})) {
        if (*p == "gpu" || *p == "auto") r.note(r.at("torchrun --nproc_per_node") + " " + *p + ": every GPU of the node");
        else if (auto n = number(*p, "torchrun --nproc_per_node")) per_node = n, per_node_key = "torchrun --nproc_per_node";
      } else if (option(t, i, {"--rdzv_backend", "--rdzv-backend", "--rdzv_endpoint", "--rdzv-endpoint", "--rdzv_id",
                               "--rdzv-id", "--master_addr", "--master-addr", "--master_port", "--master-port",
                               "--node_rank", "--node-rank", "--max_restarts", "--max-restarts"})) {
        continue;  // where and how the ranks meet: not the job
      } else {
        r.ignore("torchrun " + t[i].substr(0, t[i].find('=')));
      }
    }
  }
  // Nodes and GPUs per node matter beyond the GPU count only across nodes.
  if (nodes && *nodes > 1) r.set("nodes", *nodes, nodes_key);
  if (per_node && nodes && *nodes > 1) r.set("gpus_per_node", *per_node, per_node_key);
  if (nodes && per_node) r.set("gpus", *nodes * *per_node, nodes_key + " x " + per_node_key.substr(per_node_key.rfind(' ') + 1), *nodes * *per_node);
}

// ---------------------------------------------------------------------------------------------

void Importer::read_file(const std::string& path, const std::string& named_by) {
  std::error_code ec;
  const std::string canonical = fs::weakly_canonical(path, ec).string();
  if (std::find(seen.begin(), seen.end(), canonical) != seen.end()) return;
  seen.push_back(canonical);
  const Document d = read_document(path);
  if (!d.kind)
    fail_input(path + ": unknown config kind (not a DeepSpeed config: zero_optimization, train_micro_batch_size_per_gpu; "
               "accelerate: distributed_type; axolotl: base_model; torchtune: model._component_; LLaMA-Factory: "
               "model_name_or_path with finetuning_type; HF TrainingArguments: per_device_train_batch_size; or a torchrun/"
               "sbatch script)");
  if (!named_by.empty() && *d.kind != ConfigKind::deepspeed)
    fail_input(named_by + ": " + path + " is not a DeepSpeed config (" + to_string(*d.kind) + ")");
  imp.files.push_back({path, *d.kind});
  FileReader r{*this, imp, path, path};
  switch (*d.kind) {
    case ConfigKind::deepspeed: read_deepspeed(r, d.json); break;
    case ConfigKind::accelerate: read_accelerate(*this, r, d.json); break;
    case ConfigKind::axolotl: read_axolotl(r, d.json); break;
    case ConfigKind::torchtune: read_torchtune(r, d.json); break;
    case ConfigKind::llamafactory: read_llamafactory(r, d.json); break;
    case ConfigKind::hf_trainer: read_hf_trainer(r, d.json); break;
    case ConfigKind::torchrun:
    case ConfigKind::slurm: read_launch_script(r, d.lines); break;
  }
}

// Whether `name` appears in `text` as a whole flag or key (not inside a longer one).
bool mentions(const std::string& text, const std::string& name) {
  if (name.empty()) return false;
  for (size_t pos = text.find(name); pos != std::string::npos; pos = text.find(name, pos + 1)) {
    const size_t end = pos + name.size();
    const bool left = pos == 0 || !(std::isalnum(static_cast<unsigned char>(text[pos - 1])) || text[pos - 1] == '_' || text[pos - 1] == '-');
    const bool right = end >= text.size() || !(std::isalnum(static_cast<unsigned char>(text[end])) || text[end] == '_' || text[end] == '-');
    if (left && right) return true;
  }
  return false;
}

}  // namespace

// =============================================================================================

std::string to_string(ConfigKind kind) {
  switch (kind) {
    case ConfigKind::deepspeed: return "deepspeed";
    case ConfigKind::accelerate: return "accelerate";
    case ConfigKind::axolotl: return "axolotl";
    case ConfigKind::torchtune: return "torchtune";
    case ConfigKind::llamafactory: return "llamafactory";
    case ConfigKind::hf_trainer: return "hf-trainer";
    case ConfigKind::torchrun: return "torchrun";
    case ConfigKind::slurm: return "slurm";
  }
  return "?";
}

std::optional<ConfigKind> detect_config_kind(const Json& j) {
  if (!j.is_object()) return std::nullopt;
  const auto has = [&](const char* k) { return j.contains(k); };
  if (has("model") && j.at("model").is_object() && j.at("model").contains("_component_") &&
      j.at("model").at("_component_").is_string() && starts_with(j.at("model").at("_component_").get<std::string>(), "torchtune."))
    return ConfigKind::torchtune;
  if (has("distributed_type") || has("compute_environment")) return ConfigKind::accelerate;
  if (has("zero_optimization") || has("train_micro_batch_size_per_gpu") || has("train_batch_size") ||
      (has("bf16") && j.at("bf16").is_object()) || (has("fp16") && j.at("fp16").is_object()))
    return ConfigKind::deepspeed;
  if (has("base_model") || (has("micro_batch_size") && has("sequence_len")) || has("adapter")) return ConfigKind::axolotl;
  if (has("model_name_or_path") && (has("finetuning_type") || has("stage") || has("cutoff_len") || has("lora_target") || has("template")))
    return ConfigKind::llamafactory;
  if (has("per_device_train_batch_size") || has("num_train_epochs") || (has("gradient_accumulation_steps") && has("output_dir")))
    return ConfigKind::hf_trainer;
  return std::nullopt;
}

Json yaml_to_json(const std::string& text, const std::string& where) {
  try {
    size_t budget = 1000000;
    return node_json(YAML::Load(text), budget);
  } catch (const YAML::Exception& e) {
    fail_input(where + ": line " + std::to_string(e.mark.line + 1) + ": malformed YAML: " + e.msg);
  }
}

std::string ImportedLayout::describe() const {
  std::string d;
  if (sharding == Sharding::zero) d = "ZeRO stage " + std::to_string(zero_stage);
  else if (sharding == Sharding::fsdp) d = std::string(hybrid ? "FSDP hybrid shard" : reshard_after_forward ? "FSDP full shard" : "FSDP shard-grad-op");
  else d = "data parallel (DDP)";
  if (offload_params) d += " with optimizer and parameter offload";
  else if (offload_optimizer) d += " with optimizer offload";
  if (tp > 1) d += ", tp " + std::to_string(tp) + (sequence_parallel ? " with sequence parallelism" : "");
  if (cp > 1) d += ", cp " + std::to_string(cp);
  if (pp > 1) d += ", pp " + std::to_string(pp);
  if (dp_replicate > 0) d += ", dp_replicate " + std::to_string(dp_replicate);
  if (dp_shard > 0) d += ", dp_shard " + std::to_string(dp_shard);
  return d;
}

const ImportedValue* ConfigImport::value(const std::string& key) const {
  for (const auto& v : values)
    if (v.key == key) return &v;
  return nullptr;
}

ConfigImport read_config_files(const std::vector<std::string>& paths) {
  Importer all;
  // Which kinds were given decides whether a DeepSpeed config a YAML names is opened.
  for (const auto& p : paths) {
    const Document d = read_document(p);
    if (d.kind == ConfigKind::deepspeed) all.deepspeed_given = true;
  }
  for (const auto& p : paths) all.read_file(p, "");
  for (size_t i = 0; i < all.named.size(); ++i) all.read_file(all.named[i].first, all.named[i].second);
  ConfigImport& imp = all.imp;
  if (!imp.framework.empty()) {
    imp.values.push_back({"framework", imp.framework, imp.framework_origin, imp.framework});
  }
  if (imp.precision_mode == "fp32" && !imp.value("precision"))
    imp.values.push_back({"precision", "fp32", imp.precision_origin, imp.precision_written});
  if (imp.precision_mode == "fp16")
    imp.notes.push_back(imp.precision_origin + " " + imp.precision_written + ": fp16 planned as bf16 (the same bytes per value)");
  return imp;
}

void apply_config_values(TrainingSetup& s, ConfigImport& imp, const std::map<std::string, GivenValue>& elsewhere) {
  for (const auto& v : imp.values) {
    const FieldSpec& f = field_by_key(v.key);
    const auto other = elsewhere.find(v.key);
    if (other != elsewhere.end()) {
      if (!same_job_value(f, other->second.value, v.value))
        fail_input(other->second.origin + " contradicts " + with_value(v.origin, v.as_written));
      continue;
    }
    apply_job_field(s, f, v.value, v.origin);
  }
  if (!imp.unknown_model.empty()) {
    if (!elsewhere.count("model") && !imp.value("model"))
      fail_input(imp.unknown_model_origin + ": '" + imp.unknown_model +
                 "' is not in configs/import/model_names.json: give --model (a short name or a config.json path)");
  }
  // bf16 / fp16 in the files: the framework's own precision convention (its profile's default).
  if ((imp.precision_mode == "bf16" || imp.precision_mode == "fp16") && !imp.value("precision")) {
    const Precision expected = framework_profile(s.framework).precision;
    const auto other = elsewhere.find("precision");
    if (other != elsewhere.end() && other->second.value != to_string(expected))
      fail_input(other->second.origin + " contradicts " + imp.precision_origin + " " + imp.precision_written + " (the " + s.framework +
                 " profile's bf16 precision is " + to_string(expected) + ")");
    imp.notes.push_back(imp.precision_origin + " " + imp.precision_written + ": precision " + to_string(expected) + " (the " +
                        s.framework + " profile's bf16 convention)");
  }
  if (imp.max_steps) {
    for (const char* key : {"dataset.rows", "dataset.tokens"})
      if (elsewhere.count(key) || imp.value(key))
        fail_input((elsewhere.count(key) ? elsewhere.at(key).origin : imp.value(key)->origin) + " and " + imp.max_steps_origin +
                   " both set the job's length: give one");
    if (!imp.max_steps_per_epoch && elsewhere.count("epochs"))
      fail_input(elsewhere.at("epochs").origin + " and " + imp.max_steps_origin + " both set the job's length: give one");
  }
}

void apply_config_rules(TrainingSetup& s, ConfigImport& imp, const HardwareSpec& hw,
                        const std::map<std::string, GivenValue>& elsewhere) {
  const int64_t n = s.num_gpus;
  Parallelism layout;
  bool has_layout = false;
  if (imp.layout) {
    const ImportedLayout& l = *imp.layout;
    has_layout = true;
    // A preset where the files describe one (it keeps its name on any GPU count), else a composition.
    std::optional<Strategy> named;
    const bool degrees = l.tp > 1 || l.cp > 1 || l.pp > 1 || l.dp_replicate > 0 || l.dp_shard > 0;
    if (!degrees) {
      if (l.sharding == Sharding::none) named = n == 1 ? Strategy::single : Strategy::ddp;
      else if (l.sharding == Sharding::zero && !l.offload_optimizer) named = l.zero_stage == 1 ? Strategy::zero1 : l.zero_stage == 2 ? Strategy::zero2 : Strategy::zero3;
      else if (l.sharding == Sharding::zero && l.zero_stage == 2 && l.offload_optimizer && !l.offload_params) named = Strategy::zero2_offload;
      else if (l.sharding == Sharding::zero && l.zero_stage == 3 && l.offload_optimizer && l.offload_params) named = Strategy::zero3_offload;
      else if (l.sharding == Sharding::fsdp && !l.offload_optimizer)
        named = l.hybrid ? Strategy::fsdp_hybrid : l.reshard_after_forward ? Strategy::fsdp : Strategy::fsdp_shard_grad_op;
      if (n == 1 && l.single_on_one_gpu) named = Strategy::single;
    }
    if (named) {
      layout = preset(*named, n, hw.gpus_per_node);
    } else {
      Parallelism p;
      p.sharding = l.sharding;
      p.zero_stage = l.sharding == Sharding::none ? 0 : l.zero_stage;
      p.reshard_after_forward = l.reshard_after_forward;
      p.offload_optimizer = l.offload_optimizer;
      p.offload_params = l.offload_params;
      p.tp = l.tp;
      p.sequence_parallel = l.sequence_parallel;
      p.cp = l.cp;
      p.cp_mode = l.cp_mode;
      p.pp = l.pp;
      const int64_t fixed = l.tp * l.cp * l.pp;
      const auto rest = [&](int64_t known) {
        if (n % (fixed * known) != 0)
          fail_input(l.origin + " (" + l.describe() + "): the degrees do not divide gpus(" + std::to_string(n) + ")");
        return n / (fixed * known);
      };
      if (l.hybrid) {
        p.dp_shard = l.dp_shard > 0 ? l.dp_shard : std::min(n, hw.gpus_per_node);
        p.dp_replicate = l.dp_replicate > 0 ? l.dp_replicate : rest(p.dp_shard);
      } else if (l.sharding == Sharding::none) {
        p.dp_shard = l.dp_shard > 0 ? l.dp_shard : 1;
        p.dp_replicate = l.dp_replicate > 0 ? l.dp_replicate : rest(p.dp_shard);
      } else {
        p.dp_replicate = l.dp_replicate > 0 ? l.dp_replicate : 1;
        p.dp_shard = l.dp_shard > 0 ? l.dp_shard : rest(p.dp_replicate);
      }
      layout = p;
      named = preset_of(p);
    }
    // What the user fixed must be the same layout.
    const auto user = [&]() -> std::optional<std::pair<Parallelism, std::string>> {
      if (elsewhere.count("parallel"))
        return std::pair(parse_parallelism(s.parallel_text, "--parallel (parallel)", framework_profile(s.framework).default_sharding),
                         elsewhere.at("parallel").origin);
      if (elsewhere.count("strategy")) return std::pair(preset(*s.strategy, n, hw.gpus_per_node), elsewhere.at("strategy").origin);
      return std::nullopt;
    }();
    const std::string mine = named ? to_string(*named) : to_string(layout);
    if (user && !l.explicit_layout) {
      // The files name no layout (the Trainer's DDP is a default, not a file's value): the flag's.
      layout = user->first;
      imp.notes.push_back(l.origin + ": the files name no layout; " + user->second + " used");
      has_layout = true;
    } else if (user) {
      if (user->first != layout)
        fail_input(user->second + " contradicts " + l.origin + " (" + l.describe() + ": " + mine + " on " + std::to_string(n) + " GPUs)");
    } else if (named) {
      s.strategy = *named;
      s.parallel.reset();
      s.parallel_text.clear();
      s.given.insert("strategy");
    } else {
      s.strategy.reset();
      s.parallel = layout;
      s.parallel_text = to_string(layout);
      s.given.insert("parallel");
    }
    if (l.explicit_layout || !user) imp.notes.push_back(l.origin + ": " + l.describe() + " on " + std::to_string(n) + " GPU(s) = " + mine);
  }
  const int64_t dp = has_layout ? layout.dp() : n;
  const std::string dp_text = std::to_string(dp) + (has_layout ? " data-parallel GPU(s)" : " GPU(s)");
  // DeepSpeed: train_batch_size = train_micro_batch_size_per_gpu x gradient_accumulation_steps x data-parallel GPUs
  // (deepspeed/runtime/config.py, _batch_assertion).
  if (imp.train_batch_size) {
    const int64_t tbs = *imp.train_batch_size;
    const std::string& origin = imp.train_batch_size_origin;
    const bool ga_given = s.given.count("grad_accum") > 0;
    if (s.micro_batch && ga_given) {
      if (*s.micro_batch * s.grad_accum * dp != tbs)
        fail_input(origin + " " + std::to_string(tbs) + " != micro_batch " + std::to_string(*s.micro_batch) + " x grad_accum " +
                   std::to_string(s.grad_accum) + " x " + dp_text + " = " + std::to_string(*s.micro_batch * s.grad_accum * dp) +
                   " (DeepSpeed's rule)");
    } else if (s.micro_batch) {
      if (tbs % (*s.micro_batch * dp) != 0)
        fail_input(origin + " " + std::to_string(tbs) + " is not a multiple of micro_batch " + std::to_string(*s.micro_batch) +
                   " x " + dp_text);
      s.grad_accum = tbs / (*s.micro_batch * dp);
      s.given.insert("grad_accum");
      imp.notes.push_back(origin + " " + std::to_string(tbs) + ": grad_accum " + std::to_string(s.grad_accum) + " (= " +
                          std::to_string(tbs) + " / (micro_batch " + std::to_string(*s.micro_batch) + " x " + dp_text + "))");
    } else {
      if (tbs % (s.grad_accum * dp) != 0)
        fail_input(origin + " " + std::to_string(tbs) + " is not a multiple of grad_accum " + std::to_string(s.grad_accum) + " x " + dp_text);
      s.micro_batch = tbs / (s.grad_accum * dp);
      s.given.insert("micro_batch");
      imp.notes.push_back(origin + " " + std::to_string(tbs) + ": micro_batch " + std::to_string(*s.micro_batch) + " (= " +
                          std::to_string(tbs) + " / (grad_accum " + std::to_string(s.grad_accum) + " x " + dp_text + "))");
    }
  }
  // "auto": what the other files or the flags gave, else what the planner does.
  for (const auto& a : imp.autos) {
    std::string resolved;
    if (a.key == "micro_batch") resolved = s.micro_batch ? std::to_string(*s.micro_batch) : "searched by the planner";
    else if (a.key == "grad_accum") resolved = std::to_string(s.grad_accum) + (s.given.count("grad_accum") ? "" : " (the default)");
    else if (a.key == "train_batch_size")
      resolved = s.micro_batch ? std::to_string(*s.micro_batch * s.grad_accum * dp) + " (micro_batch x grad_accum x " + dp_text + ")"
                               : "micro_batch x grad_accum x " + dp_text + " (micro_batch searched)";
    else if (a.key == "precision")
      resolved = imp.precision_mode.empty() ? "the " + s.framework + " profile's precision"
                                            : imp.precision_mode + " (" + imp.precision_origin + " " + imp.precision_written + ")";
    else if (a.key == "learning_rate") resolved = "the job's learning rate";
    else resolved = "resolved elsewhere";
    const auto other = elsewhere.find(a.key);
    const ImportedValue* file_value = imp.value(a.key);
    const std::string from = other != elsewhere.end() ? " (" + other->second.origin + ")"
                             : file_value              ? " (" + file_value->origin + ")"
                                                       : "";
    imp.notes.push_back(a.origin + " auto: " + resolved + from);
  }
  // max_steps: the job's length in tokens, every step micro_batch x grad_accum x data-parallel GPUs rows of
  // seq_len tokens (packed, or padded to seq_len: an upper bound).
  if (imp.max_steps) {
    if (!s.micro_batch)
      fail_input(imp.max_steps_origin + ": needs the micro-batch to count the job's tokens (give it in the file or --micro-batch)");
    const double tokens = double(*imp.max_steps) * double(*s.micro_batch) * double(s.grad_accum) * double(dp) * double(s.seq_len);
    if (tokens > 1125899906842624.0) fail_input(imp.max_steps_origin + ": " + std::to_string(*imp.max_steps) + " steps is absurd");
    s.dataset.rows = 0;
    s.dataset.mean_tokens_per_row = 0;
    s.dataset.tokens = static_cast<int64_t>(tokens);
    s.given.insert("dataset.tokens");
    if (!imp.max_steps_per_epoch) {
      s.epochs = 1;
      s.given.insert("epochs");
    }
    imp.notes.push_back(imp.max_steps_origin + " " + std::to_string(*imp.max_steps) + ": " + std::to_string(s.dataset.tokens) +
                        " tokens" + (imp.max_steps_per_epoch ? " per epoch" : "") + " (steps x micro_batch " +
                        std::to_string(*s.micro_batch) + " x grad_accum " + std::to_string(s.grad_accum) + " x " + dp_text +
                        " x seq_len " + std::to_string(s.seq_len) + ")");
  }
  if (!s.micro_batch && !imp.train_batch_size) imp.notes.push_back("micro-batch: not in the files: searched by the planner");
  if (!s.checkpointing) imp.notes.push_back("checkpointing: not in the files: searched by the planner");
  if (!has_layout && !s.strategy && !s.parallel) imp.notes.push_back("layout: not in the files: searched by the planner");
}

std::string config_origins_in(const ConfigImport& imp, const std::string& message) {
  std::vector<std::string> origins;
  for (const auto& v : imp.values) {
    const FieldSpec& f = field_by_key(v.key);
    if ((mentions(message, f.flag) || mentions(message, std::string("(") + f.key + ")")) &&
        std::find(origins.begin(), origins.end(), v.origin) == origins.end())
      origins.push_back(v.origin);
  }
  if (imp.layout && (mentions(message, "--strategy") || mentions(message, "--parallel"))) origins.push_back(imp.layout->origin);
  if (origins.empty()) return "";
  std::string out = " (from ";
  for (size_t i = 0; i < origins.size(); ++i) out += (i ? "; " : "") + origins[i];
  return out + ")";
}

Json import_json(const ConfigImport& imp) {
  Json j;
  j["files"] = Json::array();
  for (const auto& f : imp.files) j["files"].push_back({{"path", f.path}, {"kind", to_string(f.kind)}});
  j["framework"] = imp.framework.empty() ? Json(nullptr) : Json(imp.framework);
  j["layout"] = imp.layout ? Json{{"describe", imp.layout->describe()}, {"from", imp.layout->origin}} : Json(nullptr);
  j["mapped"] = Json::array();
  for (const auto& v : imp.values) j["mapped"].push_back({{"key", v.key}, {"value", v.value}, {"from", v.origin}});
  j["ignored_keys"] = imp.ignored_keys;
  j["notes"] = imp.notes;
  return j;
}

std::vector<std::string> import_lines(const ConfigImport& imp) {
  std::vector<std::string> lines;
  std::string files;
  for (const auto& f : imp.files) files += (files.empty() ? "" : ", ") + f.path + " (" + to_string(f.kind) + ")";
  lines.push_back("imported: " + files);
  // One line per file: the job keys it set, each with the file's own key.
  for (const auto& f : imp.files) {
    std::string mapped;
    for (const auto& v : imp.values) {
      if (!starts_with(v.origin, f.path + ": ")) continue;
      mapped += (mapped.empty() ? "" : ", ") + v.key + " " + shown(v.value) + " (" + v.origin.substr(f.path.size() + 2) + ")";
    }
    if (!mapped.empty()) lines.push_back("  from " + f.path + ": " + mapped);
  }
  for (const auto& n : imp.notes) lines.push_back("  note: " + n);
  std::string ignored;
  for (const auto& k : imp.ignored_keys) ignored += (ignored.empty() ? "" : ", ") + k;
  lines.push_back("  ignored (" + std::to_string(imp.ignored_keys.size()) + " keys, not job settings): " + (ignored.empty() ? "none" : ignored));
  return lines;
}

std::optional<std::string> model_for_hf_id(const std::string& repo_id) {
  const std::string key = lower(repo_id);
  for (const auto& [id, model] : model_names().hf)
    if (lower(id) == key) return model;
  return std::nullopt;
}

std::optional<TorchtuneModel> model_for_torchtune_component(const std::string& component) {
  const size_t dot = component.rfind('.');
  if (dot == std::string::npos) return std::nullopt;
  std::string builder = component.substr(dot + 1);
  Method method = Method::full;
  if (starts_with(builder, "qlora_")) method = Method::qlora, builder = builder.substr(6);
  else if (starts_with(builder, "lora_")) method = Method::lora, builder = builder.substr(5);
  const std::string plain = component.substr(0, dot + 1) + builder;
  for (const auto& [b, model] : model_names().torchtune)
    if (b == plain) return TorchtuneModel{model, method};
  return std::nullopt;
}

std::optional<std::string> hf_id_for_model(const std::string& short_name) {
  for (const auto& [id, model] : model_names().hf)
    if (model == short_name) return id;
  return std::nullopt;
}

std::optional<TorchtuneBuilder> torchtune_builder_for_model(const std::string& short_name) {
  const ModelNames& n = model_names();
  for (size_t i = 0; i < n.torchtune.size(); ++i)
    if (n.torchtune[i].second == short_name) return n.torchtune_rows[i];
  return std::nullopt;
}

}  // namespace ftplan
