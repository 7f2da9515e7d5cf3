#include "cli/field_flags.h"

#include "planner/errors.h"

namespace ftplan::cli {

bool FieldFlags::has(const std::string& flag) const {
  auto it = given.find(flag);
  return it != given.end() && it->second.has_value();
}

void FieldFlags::validate() const {
  for (const auto& [flag, text] : given) {
    if (!text) continue;
    const FieldSpec& f = field_by_flag(flag);
    const nlohmann::json v = field_value_from_text(f, *text, flag);
    switch (f.type) {
      case FieldType::integer: field_int(f, v, flag); break;
      case FieldType::number: field_number(f, v, flag); break;
      case FieldType::boolean: field_bool(f, v, flag); break;
      case FieldType::choice: {
        const std::string value = field_text(f, v, flag), choices = std::string("|") + f.choices + "|";
        if (choices.find("|" + value + "|") == std::string::npos)
          fail_input(flag + ": '" + value + "' is not one of " + f.choices);
        break;
      }
      default: field_text(f, v, flag); break;
    }
  }
}

std::optional<int64_t> FieldFlags::get_int(const std::string& flag) const {
  if (!has(flag)) return std::nullopt;
  const FieldSpec& f = field_by_flag(flag);
  return field_int(f, field_value_from_text(f, *given.at(flag), flag), flag);
}

std::optional<double> FieldFlags::get_number(const std::string& flag) const {
  if (!has(flag)) return std::nullopt;
  const FieldSpec& f = field_by_flag(flag);
  return field_number(f, field_value_from_text(f, *given.at(flag), flag), flag);
}

std::optional<std::string> FieldFlags::get_text(const std::string& flag) const {
  if (!has(flag)) return std::nullopt;
  return field_text(field_by_flag(flag), *given.at(flag), flag);
}

void FieldFlags::apply_job(TrainingSetup& s) const {
  for (const FieldSpec& f : field_table()) {
    if (!(f.places & kInJobFile) || !*f.flag || !has(f.flag)) continue;
    apply_job_field(s, f, field_value_from_text(f, *given.at(f.flag), f.flag), f.flag);
  }
  if (has("--dataset-rows") && !has("--dataset-tokens")) s.dataset.tokens = 0;
  if (has("--dataset-tokens") && !has("--dataset-rows")) s.dataset.rows = 0;
}

nlohmann::json job_field_defaults() {
  nlohmann::json flat = nlohmann::json::object();
  const nlohmann::json j = training_setup_to_json(TrainingSetup{});
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it->is_object()) {
      for (auto sub = it->begin(); sub != it->end(); ++sub) flat[it.key() + "." + sub.key()] = *sub;
    } else {
      flat[it.key()] = *it;
    }
  }
  return flat;
}

void bind_field_flags(CLI::App& app, FieldFlags& flags, unsigned places, const nlohmann::json& defaults) {
  for (const FieldSpec& f : field_table()) {
    if (!(f.places & places) || !*f.flag) continue;
    std::string help = f.help;
    const std::string range = field_range_text(f);
    if (!range.empty()) help += " " + (f.type == FieldType::choice ? "{" + range + "}" : range);
    const nlohmann::json* def = nullptr;
    if (defaults.is_object() && defaults.contains(f.flag)) def = &defaults.at(f.flag);
    else if (defaults.is_object() && *f.key && defaults.contains(f.key)) def = &defaults.at(f.key);
    if (def && !def->is_null() && !(def->is_string() && def->get<std::string>().empty())) help += " (default " + (def->is_string() ? def->get<std::string>() : def->dump()) + ")";
    auto& slot = flags.given[f.flag];
    if (f.type == FieldType::boolean) {
      app.add_flag_callback(f.flag, [&slot] { slot = "true"; }, help);
      continue;
    }
    const char* type = f.type == FieldType::integer ? "INT" : f.type == FieldType::number ? "NUMBER"
                       : f.type == FieldType::choice ? "CHOICE" : f.type == FieldType::list ? "LIST" : "TEXT";
    app.add_option(f.flag, slot, help)->type_name(type);
  }
}

}  // namespace ftplan::cli
