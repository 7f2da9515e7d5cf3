#include "planner/gpu_catalogue.h"

#include <algorithm>
#include <sstream>

#include "planner/format.h"

namespace ftplan {
namespace {

constexpr double kGiB = 1073741824.0;  // 2^30

// A fixed-width text table: columns left-aligned for text, right-aligned for figures.
struct Column {
  std::string header;
  bool right;  // figures
};

std::string render(const std::vector<Column>& columns, const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width(columns.size());
  for (size_t c = 0; c < columns.size(); ++c) {
    width[c] = columns[c].header.size();
    for (const auto& r : rows) width[c] = std::max(width[c], r[c].size());
  }
  std::ostringstream out;
  auto line = [&](const std::vector<std::string>& cells) {
    std::string text;
    for (size_t c = 0; c < cells.size(); ++c) {
      const std::string pad(width[c] - cells[c].size(), ' ');
      const bool last = c + 1 == cells.size();
      text += columns[c].right ? pad + cells[c] : cells[c] + (last ? "" : pad);
      if (!last) text += "  ";
    }
    out << text << "\n";
  };
  std::vector<std::string> headers;
  for (const auto& c : columns) headers.push_back(c.header);
  line(headers);
  std::vector<std::string> rules;
  for (size_t w : width) rules.push_back(std::string(w, '-'));
  line(rules);
  for (const auto& r : rows) line(r);
  return out.str();
}

// "0" stays "-" where a GPU has no such unit (no FP8 on Ampere), so a zero is not read as a figure.
std::string tflops(double flops) { return flops > 0 ? format_fixed(flops / 1e12, 1) : "-"; }

}  // namespace

std::vector<HardwareSpec> load_gpu_catalogue() {
  std::vector<HardwareSpec> gpus;
  for (const auto& id : list_hardware_ids()) gpus.push_back(load_hardware(id));
  return gpus;
}

std::string gpu_catalogue_table(const std::vector<HardwareSpec>& gpus) {
  const std::vector<Column> columns = {
      {"id", false},           {"memory GiB", true}, {"usable GiB", true}, {"bf16 TFLOP/s", true}, {"fp8 TFLOP/s", true},
      {"mem TB/s", true},      {"NVLink domain", true}, {"PCIe-only", false}, {"PCIe", false}, {"GPUs/node", true},
      {"host GiB/node", true}, {"USD/GPU-h", true},  {"price read", false}, {"name", false}};
  std::vector<std::vector<std::string>> rows;
  for (const auto& hw : gpus)
    rows.push_back({hw.id,
                    format_fixed(hw.memory_bytes / kGiB, 2),
                    format_fixed(usable_device_bytes(hw) / kGiB, 2),
                    tflops(hw.peak_flops_bf16),
                    tflops(hw.peak_flops_fp8),
                    format_fixed(hw.hbm_bandwidth_bytes_per_s / 1e12, 2),
                    std::to_string(hw.nvlink_domain_size),
                    hw.pcie_only ? "yes" : "no",
                    hw.pcie_slot.stated() ? hw.pcie_slot.to_string() : "-",
                    std::to_string(hw.gpus_per_node),
                    format_fixed(hw.host_memory_bytes_per_node / kGiB, 0),
                    format_fixed(hw.price_usd_per_gpu_hour, 2),
                    hw.price_date,
                    hw.kind == "gpu" ? hw.name : hw.name + " [" + hw.kind + "]"});
  return render(columns, rows) +
         "memory: what nvidia-smi / rocm-smi reports; usable: what one process can allocate (torch's total "
         "capacity, where hwdb states it), which fits is judged against; peaks: dense (no sparsity); price: indicative on-demand "
         "rental, with its source in hwdb/<id>.json (override: --price-per-gpu-hour); PCIe: the card's own interface "
         "(a narrower slot: --pcie-slot)\n";
}

nlohmann::json gpu_catalogue_json(const std::vector<HardwareSpec>& gpus) {
  nlohmann::json list = nlohmann::json::array();
  for (const auto& hw : gpus) {
    const auto source = hw.sources.find("price_usd_per_gpu_hour");
    list.push_back({{"id", hw.id},
                    {"name", hw.name},
                    {"kind", hw.kind},
                    {"memory_bytes", hw.memory_bytes},
                    {"memory_gib", hw.memory_bytes / kGiB},
                    {"usable_memory_bytes", usable_device_bytes(hw)},
                    {"peak_flops_bf16", hw.peak_flops_bf16},
                    {"peak_flops_fp8", hw.peak_flops_fp8},
                    {"hbm_bandwidth_bytes_per_s", hw.hbm_bandwidth_bytes_per_s},
                    {"nvlink_domain_size", hw.nvlink_domain_size},
                    {"pcie_only", hw.pcie_only},
                    {"pcie_slot", hw.pcie_slot.stated() ? nlohmann::json(hw.pcie_slot.key()) : nlohmann::json()},
                    {"gpus_per_node", hw.gpus_per_node},
                    {"host_memory_bytes_per_node", hw.host_memory_bytes_per_node},
                    {"price_usd_per_gpu_hour", hw.price_usd_per_gpu_hour},
                    {"price_date", hw.price_date},
                    {"price_source", source == hw.sources.end() ? "" : source->second}});
  }
  return {{"gpus", list}};
}

}  // namespace ftplan
