// The field table's flags (planner/job_fields.h) on a CLI11 app: every value is taken as the text
// the user typed and parsed and range-checked by the table, so ftplan and ftexec accept the same
// values with the same one-line errors, and --help shows each flag's range, unit and default.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "planner/job_fields.h"
#include "planner/training_setup.h"

namespace ftplan::cli {

struct FieldFlags {
  std::map<std::string, std::optional<std::string>> given;  // flag -> text as typed (bound storage)

  bool has(const std::string& flag) const;
  // Parses and range-checks every given flag (choices too), so that a bad value is reported before
  // any whole-job check: call first.
  void validate() const;
  // A given flag parsed and checked against its row of the table; nullopt when it was not given.
  std::optional<int64_t> get_int(const std::string& flag) const;
  std::optional<double> get_number(const std::string& flag) const;
  std::optional<std::string> get_text(const std::string& flag) const;
  // Applies every given flag of a job field (kInJobFile) to the setup, in table order. Dataset
  // rows and tokens replace each other.
  void apply_job(TrainingSetup& setup) const;
};

// Binds every field of the table whose places include one of `places` (e.g. kFtplanFlag), with its
// range and unit in the help, and the default taken from `defaults` (a JSON object by job key or
// by flag) where it has one.
void bind_field_flags(CLI::App& app, FieldFlags& flags, unsigned places, const nlohmann::json& defaults = {});

// The defaults of the job fields, by key: a default TrainingSetup as a job file would hold it.
nlohmann::json job_field_defaults();

}  // namespace ftplan::cli
