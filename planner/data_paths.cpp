#include "planner/data_paths.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include "planner/errors.h"

#ifndef FTPLAN_SOURCE_DIR
#define FTPLAN_SOURCE_DIR "."
#endif

namespace ftplan {
namespace fs = std::filesystem;

std::string data_dir() {
  const char* env = std::getenv("FTPLAN_DATA_DIR");
  return (env && *env) ? env : FTPLAN_SOURCE_DIR;
}

std::vector<std::string> list_data_names(const std::string& folder) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(fs::path(data_dir()) / folder, ec))
    if (entry.path().extension() == ".json") names.push_back(entry.path().stem().string());
  std::sort(names.begin(), names.end());
  return names;
}

std::string resolve_data_file(const std::string& name_or_path, const std::string& folder,
                              const std::string& field) {
  if (name_or_path.empty()) fail_input(field + ": empty");
  std::error_code ec;
  if (fs::is_regular_file(name_or_path, ec)) return name_or_path;
  bool looks_like_path = name_or_path.find('/') != std::string::npos ||
                         (name_or_path.size() > 5 && name_or_path.substr(name_or_path.size() - 5) == ".json");
  if (looks_like_path) fail_input(field + ": no such file '" + name_or_path + "'");
  fs::path shipped = fs::path(data_dir()) / folder / (name_or_path + ".json");
  if (fs::is_regular_file(shipped, ec)) return shipped.string();
  std::string known;
  for (const auto& n : list_data_names(folder)) known += (known.empty() ? "" : ", ") + n;
  fail_input(field + ": unknown name '" + name_or_path + "' (known: " + known + ")");
}

}  // namespace ftplan
