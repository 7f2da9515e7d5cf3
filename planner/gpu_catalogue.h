// The GPU catalogue: every hwdb entry's headline figures in one table (`ftplan gpus`), computed once
// and printed as a text table or JSON. Memory is what nvidia-smi / rocm-smi reports (GiB = 2^30),
// peaks are dense, the price is the dated on-demand listing in the entry's "sources".
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "planner/hardware_spec.h"

namespace ftplan {

// Every shipped hwdb entry, in id order (the CPU pseudo device included, marked kind "cpu").
std::vector<HardwareSpec> load_gpu_catalogue();

// One row per entry: id, memory GiB, bf16 and fp8 dense TFLOP/s, memory TB/s, NVLink domain,
// PCIe-only, GPUs per node, host GiB per node, USD per GPU-hour and the month it was read, name.
std::string gpu_catalogue_table(const std::vector<HardwareSpec>& gpus);

// {"gpus": [{"id", "name", "kind", "memory_bytes", "memory_gib", "peak_flops_bf16", "peak_flops_fp8",
//            "hbm_bandwidth_bytes_per_s", "nvlink_domain_size", "pcie_only", "gpus_per_node",
//            "host_memory_bytes_per_node", "price_usd_per_gpu_hour", "price_date", "price_source"}, ...]}
nlohmann::json gpu_catalogue_json(const std::vector<HardwareSpec>& gpus);

}  // namespace ftplan
