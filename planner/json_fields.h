// Strict readers for JSON fields: a field of the wrong type, a non-finite or out-of-range number or
// an unknown key is an InputError that names "<where>: <field>".
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include <nlohmann/json.hpp>

namespace ftplan {

// Throws unless every key of `object` is in `known`.
void require_known_keys(const nlohmann::json& object, std::initializer_list<const char*> known,
                        const std::string& where);

bool has_field(const nlohmann::json& object, const char* key);

// Required fields.
int64_t read_int(const nlohmann::json& object, const char* key, const std::string& where,
                 int64_t min_value = 1, int64_t max_value = INT64_C(1) << 40);
double read_number(const nlohmann::json& object, const char* key, const std::string& where,
                   double min_value = 0.0, double max_value = 1e30);
std::string read_string(const nlohmann::json& object, const char* key, const std::string& where);
bool read_bool(const nlohmann::json& object, const char* key, const std::string& where);

// Optional fields: the default when the key is absent or null.
int64_t read_int_or(const nlohmann::json& object, const char* key, int64_t fallback,
                    const std::string& where, int64_t min_value = 1,
                    int64_t max_value = INT64_C(1) << 40);
double read_number_or(const nlohmann::json& object, const char* key, double fallback,
                      const std::string& where, double min_value = 0.0, double max_value = 1e30);
std::string read_string_or(const nlohmann::json& object, const char* key, const std::string& fallback,
                           const std::string& where);
bool read_bool_or(const nlohmann::json& object, const char* key, bool fallback,
                  const std::string& where);

// Parses a whole file; a missing file, malformed JSON or a number that overflows a double is an
// InputError naming the file (and the key nearest the overflow).
nlohmann::json read_json_file(const std::string& path);

// Writes text to path as planner/output_file.h's write_output does (atomically for regular files;
// symlink targets and special files written in place), naming the path in errors.
void write_file_atomically(const std::string& path, const std::string& text);

}  // namespace ftplan
