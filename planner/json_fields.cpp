#include "planner/json_fields.h"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>


#include "planner/errors.h"
#include "planner/output_file.h"

namespace ftplan {
namespace {

std::string field_name(const std::string& where, const char* key) {
  return where.empty() ? std::string(key) : where + ": " + key;
}

const nlohmann::json& field(const nlohmann::json& object, const char* key, const std::string& where) {
  if (!object.is_object()) fail_input(where + ": expected a JSON object");
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) fail_input(field_name(where, key) + ": missing");
  return *it;
}

}  // namespace

void require_known_keys(const nlohmann::json& object, std::initializer_list<const char*> known,
                        const std::string& where) {
  if (!object.is_object()) fail_input(where + ": expected a JSON object");
  for (auto it = object.begin(); it != object.end(); ++it) {
    bool found = false;
    for (const char* k : known) found = found || it.key() == k;
    if (!found) fail_input(field_name(where, it.key().c_str()) + ": unknown key");
  }
}

bool has_field(const nlohmann::json& object, const char* key) {
  return object.is_object() && object.contains(key) && !object.at(key).is_null();
}

int64_t read_int(const nlohmann::json& object, const char* key, const std::string& where,
                 int64_t min_value, int64_t max_value) {
  const auto& v = field(object, key, where);
  int64_t value = 0;
  if (v.is_number_integer()) {
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
      fail_input(field_name(where, key) + ": too large");
    value = v.get<int64_t>();
  } else if (v.is_number_float() && std::isfinite(v.get<double>()) &&
             std::floor(v.get<double>()) == v.get<double>() && std::fabs(v.get<double>()) < 9e15) {
    value = static_cast<int64_t>(v.get<double>());
  } else {
    fail_input(field_name(where, key) + ": expected an integer, got " + v.dump());
  }
  if (value < min_value || value > max_value)
    fail_input(field_name(where, key) + ": " + std::to_string(value) + " is out of range [" +
               std::to_string(min_value) + ", " + std::to_string(max_value) + "]");
  return value;
}

double read_number(const nlohmann::json& object, const char* key, const std::string& where,
                   double min_value, double max_value) {
  const auto& v = field(object, key, where);
  if (!v.is_number()) fail_input(field_name(where, key) + ": expected a number, got " + v.dump());
  double value = v.get<double>();
  if (!std::isfinite(value) || value < min_value || value > max_value) {
    std::ostringstream msg;
    msg << field_name(where, key) << ": " << value << " is out of range [" << min_value << ", "
        << max_value << "]";
    fail_input(msg.str());
  }
  return value;
}

std::string read_string(const nlohmann::json& object, const char* key, const std::string& where) {
  const auto& v = field(object, key, where);
  if (!v.is_string()) fail_input(field_name(where, key) + ": expected a string, got " + v.dump());
  return v.get<std::string>();
}

bool read_bool(const nlohmann::json& object, const char* key, const std::string& where) {
  const auto& v = field(object, key, where);
  if (!v.is_boolean()) fail_input(field_name(where, key) + ": expected true or false, got " + v.dump());
  return v.get<bool>();
}

int64_t read_int_or(const nlohmann::json& object, const char* key, int64_t fallback,
                    const std::string& where, int64_t min_value, int64_t max_value) {
  return has_field(object, key) ? read_int(object, key, where, min_value, max_value) : fallback;
}

double read_number_or(const nlohmann::json& object, const char* key, double fallback,
                      const std::string& where, double min_value, double max_value) {
  return has_field(object, key) ? read_number(object, key, where, min_value, max_value) : fallback;
}

std::string read_string_or(const nlohmann::json& object, const char* key, const std::string& fallback,
                           const std::string& where) {
  return has_field(object, key) ? read_string(object, key, where) : fallback;
}

bool read_bool_or(const nlohmann::json& object, const char* key, bool fallback,
                  const std::string& where) {
  return has_field(object, key) ? read_bool(object, key, where) : fallback;
}

nlohmann::json read_json_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail_input(path + ": cannot open file");
  // The parser's callback remembers the last key, so that a number the parser cannot hold (1e400
  // overflows a double) is reported with the field it belongs to.
  std::string last_key;
  auto remember_key = [&](int, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    if (event == nlohmann::json::parse_event_t::key) last_key = parsed.get<std::string>();
    return true;
  };
  try {
    return nlohmann::json::parse(in, remember_key);
  } catch (const nlohmann::json::parse_error& e) {
    std::string what = e.what();
    fail_input(path + ": malformed JSON (" + what.substr(what.find(']') + 2) + ")");
  } catch (const nlohmann::json::exception& e) {  // out_of_range 406: a number overflows a double
    std::string what = e.what();
    fail_input(path + (last_key.empty() ? "" : ": " + last_key) + ": number out of range (" +
               what.substr(what.find(']') + 2) + ")");
  }
}

void write_file_atomically(const std::string& path, const std::string& text) { write_output(path, text, path); }

}  // namespace ftplan
