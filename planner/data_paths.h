// Where the shipped data lives (hwdb/, configs/): $FTPLAN_DATA_DIR if set, else the source tree the
// binary was built from. Short names resolve against it: --model llama-3-8b reads
// configs/models/llama-3-8b.json, --gpu a100-80gb-sxm reads hwdb/a100-80gb-sxm.json.
#pragma once

#include <string>
#include <vector>

namespace ftplan {

std::string data_dir();

// A path if `name_or_path` names an existing file (or ends in .json), else
// data_dir()/<folder>/<name>.json; an InputError naming `field` when neither exists.
std::string resolve_data_file(const std::string& name_or_path, const std::string& folder,
                              const std::string& field);

// The stems of the .json files in data_dir()/<folder>, sorted.
std::vector<std::string> list_data_names(const std::string& folder);

}  // namespace ftplan
