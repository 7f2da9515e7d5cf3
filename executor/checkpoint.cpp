#include "executor/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "planner/errors.h"
#include "planner/output_file.h"

namespace ftexec {
namespace fs = std::filesystem;
namespace {

constexpr const char* kManifest = "manifest.json";

std::string errno_text() { return std::strerror(errno); }

// "step-12" -> 12; -1 for anything else.
int64_t step_of_folder_name(const std::string& name) {
  if (name.rfind("step-", 0) != 0 || name.size() == 5 || name.size() > 5 + 18) return -1;
  int64_t s = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    s = s * 10 + (name[i] - '0');
  }
  return s;
}

// A manifest value as the user reads it: strings quoted, absent as "none".
std::string shown(const nlohmann::json* v) { return v ? v->dump() : std::string("none"); }

std::string read_latest(const std::string& dir) {
  std::ifstream in(fs::path(dir) / "latest");
  std::string sub;
  if (in) in >> sub;
  return sub;
}

std::string incomplete_note(const CheckpointFolder& f) {
  return f.path + " is incomplete (no " + kManifest + ": the run stopped while writing it)";
}

}  // namespace

FileDigest file_digest(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) throw std::runtime_error(path + ": cannot read (" + errno_text() + ")");
  FileDigest d;
  uLong crc = ::crc32(0L, Z_NULL, 0);
  std::vector<unsigned char> buf(size_t(1) << 20);
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), f)) > 0) {
    crc = ::crc32(crc, buf.data(), static_cast<uInt>(n));
    d.bytes += static_cast<int64_t>(n);
  }
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) throw std::runtime_error(path + ": read failed");
  d.crc32 = static_cast<uint32_t>(crc);
  return d;
}

std::string crc32_hex(uint32_t crc) {
  char s[9];
  std::snprintf(s, sizeof(s), "%08x", crc);
  return s;
}

std::string crc32_hex(const std::string& bytes) {
  uLong crc = ::crc32(0L, Z_NULL, 0);
  for (size_t i = 0; i < bytes.size(); i += size_t(1) << 30) {
    const size_t n = std::min(bytes.size() - i, size_t(1) << 30);
    crc = ::crc32(crc, reinterpret_cast<const Bytef*>(bytes.data() + i), static_cast<uInt>(n));
  }
  return crc32_hex(static_cast<uint32_t>(crc));
}

void write_file_durably(const std::string& path, const std::string& text) {
  // planner/output_file.h writes a temporary file, fsyncs it, renames it and fsyncs the folder; a
  // failure while saving a checkpoint is a runtime failure, not bad input.
  try {
    ftplan::write_output(path, text, "checkpoint");
  } catch (const ftplan::InputError& e) {
    throw std::runtime_error(std::string(e.what()) + "; the previous file, if any, is unchanged");
  }
}

nlohmann::json checkpoint_manifest(int64_t step, int world_size, const std::string& model, const nlohmann::json& layout,
                                   const std::map<std::string, FileDigest>& files) {
  nlohmann::json listed = nlohmann::json::object();
  for (const auto& [name, d] : files) listed[name] = {{"bytes", d.bytes}, {"crc32", crc32_hex(d.crc32)}};
  return {{"format", kCheckpointFormat}, {"step", step},     {"world_size", world_size}, {"model", model},
          {"layout", layout},            {"checksum", "crc32"}, {"files", listed}};
}

std::vector<std::string> checkpoint_layout_differences(const nlohmann::json& manifest, int64_t folder_step,
                                                       int world_size, const nlohmann::json& layout) {
  std::vector<std::string> out;
  if (!manifest.is_object()) return {"the manifest is not a JSON object"};
  const auto format = manifest.find("format");
  if (format == manifest.end() || *format != kCheckpointFormat)
    return {"format: checkpoint " + shown(format == manifest.end() ? nullptr : &*format) + ", this ftexec reads \"" +
            kCheckpointFormat + "\" (older checkpoints carry no checksums and cannot be verified)"};
  const auto step = manifest.find("step");
  if (step == manifest.end() || !step->is_number_integer() || step->get<int64_t>() != folder_step)
    out.push_back("step: manifest " + shown(step == manifest.end() ? nullptr : &*step) + ", folder step-" +
                  std::to_string(folder_step));
  const auto world = manifest.find("world_size");
  if (world == manifest.end() || *world != world_size)
    out.push_back("world_size: checkpoint " + shown(world == manifest.end() ? nullptr : &*world) + ", this run " +
                  std::to_string(world_size));
  const auto theirs = manifest.find("layout");
  if (theirs == manifest.end() || !theirs->is_object()) {
    out.push_back("layout: missing from the manifest");
    return out;
  }
  // Every field of either side, in a stable order: this run's first, then any only the checkpoint has.
  std::vector<std::string> keys;
  for (auto it = layout.begin(); it != layout.end(); ++it) keys.push_back(it.key());
  for (auto it = theirs->begin(); it != theirs->end(); ++it)
    if (!layout.contains(it.key())) keys.push_back(it.key());
  for (const auto& k : keys) {
    const auto a = theirs->find(k);
    const auto b = layout.find(k);
    const nlohmann::json* av = a == theirs->end() ? nullptr : &*a;
    const nlohmann::json* bv = b == layout.end() ? nullptr : &*b;
    if (av && bv && *av == *bv) continue;
    out.push_back(k + ": checkpoint " + shown(av) + ", this run " + shown(bv));
  }
  return out;
}

std::string checkpoint_file_problem(const nlohmann::json& manifest, const std::string& folder, const std::string& file) {
  const std::string path = (fs::path(folder) / file).string();
  const auto files = manifest.find("files");
  if (files == manifest.end() || !files->is_object() || !files->contains(file))
    return path + ": not listed in " + kManifest;
  const nlohmann::json& e = (*files)[file];
  if (!e.is_object() || !e.contains("bytes") || !e["bytes"].is_number_integer() || !e.contains("crc32") ||
      !e["crc32"].is_string())
    return (fs::path(folder) / kManifest).string() + ": files." + file + " needs \"bytes\" (integer) and \"crc32\" (hex)";
  const int64_t bytes = e["bytes"].get<int64_t>();
  const std::string crc = e["crc32"].get<std::string>();
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  if (ec) return path + ": missing (" + ec.message() + "); the manifest lists " + std::to_string(bytes) + " bytes";
  if (int64_t(size) != bytes)
    return path + ": " + std::to_string(size) + " bytes != manifest " + std::to_string(bytes) +
           " (truncated, corrupted, or from another checkpoint)";
  FileDigest d;
  try {
    d = file_digest(path);
  } catch (const std::exception& x) {
    return x.what();
  }
  if (crc32_hex(d.crc32) == crc) return "";
  // Another file of this checkpoint put in its place (shards swapped between ranks)?
  for (auto it = files->begin(); it != files->end(); ++it)
    if (it.key() != file && it->is_object() && it->value("crc32", "") == crc32_hex(d.crc32) && it->value("bytes", -1) == d.bytes)
      return path + ": crc32 " + crc32_hex(d.crc32) + " != manifest " + crc + " (it is the manifest's " + it.key() +
             ": files swapped or copied over)";
  return path + ": crc32 " + crc32_hex(d.crc32) + " != manifest " + crc + " (corrupted, or from another checkpoint)";
}

std::vector<CheckpointFolder> checkpoint_folders(const std::string& dir) {
  std::vector<CheckpointFolder> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const int64_t step = step_of_folder_name(it->path().filename().string());
    std::error_code e2;
    if (step < 0 || !it->is_directory(e2)) continue;
    out.push_back({step, it->path().string(), fs::is_regular_file(it->path() / kManifest, e2)});
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.step < b.step; });
  return out;
}

CheckpointChoice checkpoint_choose(const std::string& dir) {
  const auto folders = checkpoint_folders(dir);
  auto newest = std::find_if(folders.rbegin(), folders.rend(), [](const auto& f) { return f.complete; });
  if (newest == folders.rend()) {
    std::string why = fs::exists(dir) ? "no step-*/" + std::string(kManifest) : "it does not exist";
    if (!folders.empty()) why = incomplete_note(folders.back());
    ftplan::fail_input("--resume: no complete checkpoint in " + dir + " (" + why + ")");
  }
  CheckpointChoice c{*newest, ""};
  if (newest != folders.rbegin())
    c.note = incomplete_note(folders.back()) + "; resuming from " + newest->path + ", the newest complete checkpoint";
  return c;
}

void checkpoint_preflight(const std::string& dir, bool resume) {
  if (resume) {
    checkpoint_choose(dir);
  } else {
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) ftplan::fail_input("--checkpoint-dir " + dir + ": cannot create it (" + ec.message() + ")");
    const auto folders = checkpoint_folders(dir);
    auto newest = std::find_if(folders.rbegin(), folders.rend(), [](const auto& f) { return f.complete; });
    if (newest != folders.rend())
      ftplan::fail_input("--checkpoint-dir " + dir + ": already holds the checkpoints of a run (newest complete: " +
                         newest->path + "); add --resume to continue it, or choose another directory");
  }
  if (::access(dir.c_str(), W_OK) != 0)
    ftplan::fail_input("--checkpoint-dir " + dir + ": not writable (" + errno_text() + ")");
}

std::vector<std::string> checkpoint_rotate(const std::string& dir, int64_t keep_last, std::vector<std::string>* failed) {
  std::vector<std::string> removed;
  if (keep_last < 1) return removed;
  const auto folders = checkpoint_folders(dir);
  const std::string latest = read_latest(dir);
  int64_t newest_complete = -1, complete_seen = 0;
  for (const auto& f : folders)
    if (f.complete) newest_complete = f.step;
  // Newest first, so the first keep_last complete ones are counted before any is removed.
  for (auto it = folders.rbegin(); it != folders.rend(); ++it) {
    const CheckpointFolder& f = *it;
    const bool keep = f.complete ? complete_seen++ < keep_last : f.step > newest_complete;
    if (keep || fs::path(f.path).filename().string() == latest) continue;
    std::error_code ec;
    if (f.complete) fs::remove(fs::path(f.path) / kManifest, ec);
    if (!ec) fs::remove_all(f.path, ec);
    if (!ec) removed.push_back(f.path);
    else if (failed) failed->push_back(f.path + " (" + ec.message() + ")");
  }
  return removed;
}

}  // namespace ftexec
