#include "executor/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include <nlohmann/json.hpp>

#include "planner/errors.h"

namespace ftexec {
namespace {

constexpr uint64_t kMaxHeaderBytes = 100u << 20;  // the reference implementation's limit

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace

size_t safetensors_dtype_bytes(const std::string& dtype, const std::string& where) {
  if (dtype == "F32" || dtype == "I32") return 4;
  if (dtype == "BF16" || dtype == "F16" || dtype == "I16") return 2;
  if (dtype == "F64" || dtype == "I64") return 8;
  if (dtype == "U8" || dtype == "I8" || dtype == "BOOL") return 1;
  ftplan::fail_input(where + ": unsupported dtype \"" + dtype + "\" (F32, BF16, F16, F64, I64, I32, I16, I8, U8, BOOL)");
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) ftplan::fail_input(path + ": cannot open (" + std::strerror(errno) + ")");
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    ftplan::fail_input(path + ": not a regular file");
  }
  map_bytes_ = static_cast<size_t>(st.st_size);
  if (map_bytes_ < 8) {
    ::close(fd);
    ftplan::fail_input(path + ": too short for a safetensors file (" + std::to_string(map_bytes_) + " bytes)");
  }
  map_ = ::mmap(nullptr, map_bytes_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    ftplan::fail_input(path + ": cannot map (" + std::strerror(errno) + ")");
  }
  try {
    const auto* bytes = static_cast<const unsigned char*>(map_);
    uint64_t header_bytes = 0;
    for (int i = 7; i >= 0; --i) header_bytes = (header_bytes << 8) | bytes[i];
    if (header_bytes > kMaxHeaderBytes || header_bytes > map_bytes_ - 8)
      ftplan::fail_input(path + ": header length " + std::to_string(header_bytes) + " exceeds the file (" +
                         std::to_string(map_bytes_) + " bytes): not a safetensors file");
    nlohmann::json header;
    try {
      header = nlohmann::json::parse(bytes + 8, bytes + 8 + header_bytes);
    } catch (const nlohmann::json::exception& e) {
      ftplan::fail_input(path + ": header is not JSON (" + e.what() + ")");
    }
    if (!header.is_object()) ftplan::fail_input(path + ": header is not a JSON object");
    const uint64_t data_begin = 8 + header_bytes;
    const uint64_t data_bytes = map_bytes_ - data_begin;
    for (const auto& [name, info] : header.items()) {
      if (name == "__metadata__") {
        if (!info.is_object()) ftplan::fail_input(path + ": __metadata__ is not an object");
        for (const auto& [k, v] : info.items()) {
          if (!v.is_string()) ftplan::fail_input(path + ": __metadata__." + k + " is not a string");
          metadata_[k] = v.get<std::string>();
        }
        continue;
      }
      const std::string where = path + ": " + name;
      if (!info.is_object() || !info.contains("dtype") || !info.contains("shape") || !info.contains("data_offsets"))
        ftplan::fail_input(where + ": needs dtype, shape and data_offsets");
      SafetensorsEntry e;
      e.name = name;
      try {
        e.dtype = info.at("dtype").get<std::string>();
        e.shape = info.at("shape").get<std::vector<int64_t>>();
        auto offsets = info.at("data_offsets").get<std::vector<uint64_t>>();
        if (offsets.size() != 2 || offsets[0] > offsets[1] || offsets[1] > data_bytes)
          ftplan::fail_input(where + ": data_offsets outside the file's data (" + std::to_string(data_bytes) + " bytes)");
        e.data = bytes + data_begin + offsets[0];
        e.nbytes = offsets[1] - offsets[0];
      } catch (const nlohmann::json::exception& ex) {
        ftplan::fail_input(where + ": malformed entry (" + ex.what() + ")");
      }
      uint64_t numel = 1;
      for (int64_t d : e.shape) {
        if (d < 0) ftplan::fail_input(where + ": negative dimension in shape " + shape_string(e.shape));
        numel *= static_cast<uint64_t>(d);
      }
      if (numel * safetensors_dtype_bytes(e.dtype, where) != e.nbytes)
        ftplan::fail_input(where + ": " + std::to_string(e.nbytes) + " bytes do not hold a " + e.dtype + " tensor of shape " +
                           shape_string(e.shape));
      entries_.push_back(std::move(e));
    }
    // Byte ranges must not overlap (the reference reader also requires them to tile the buffer).
    std::vector<const SafetensorsEntry*> sorted;
    for (const auto& e : entries_) sorted.push_back(&e);
    std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->data < b->data; });
    for (size_t i = 1; i < sorted.size(); ++i) {
      const auto* prev = sorted[i - 1];
      if (static_cast<const char*>(prev->data) + prev->nbytes > static_cast<const char*>(sorted[i]->data))
        ftplan::fail_input(path + ": tensors " + prev->name + " and " + sorted[i]->name + " overlap");
    }
  } catch (...) {
    ::munmap(map_, map_bytes_);
    map_ = nullptr;
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(map_, map_bytes_);
}

const SafetensorsEntry* SafetensorsFile::find(const std::string& name) const {
  for (const auto& e : entries_)
    if (e.name == name) return &e;
  return nullptr;
}

namespace {

uint64_t nbytes_of(const std::string& dtype, const std::vector<int64_t>& shape, const std::string& where) {
  uint64_t numel = 1;
  for (int64_t d : shape) numel *= static_cast<uint64_t>(d);
  return numel * safetensors_dtype_bytes(dtype, where);
}

// The 8-byte length and the JSON header (padded with spaces so the data starts 8-byte aligned) of
// tensors laid out in the given order; `offsets` receives each one's data offset.
std::string header_bytes(const std::vector<SafetensorsWriter::Tensor>& tensors, const std::map<std::string, std::string>& metadata,
                         const std::string& path, std::vector<uint64_t>* offsets, uint64_t* data_bytes) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    const uint64_t n = nbytes_of(t.dtype, t.shape, path + ": " + t.name);
    if (header.contains(t.name)) throw std::runtime_error(path + ": tensor " + t.name + " listed twice");
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + n}}};
    if (offsets) offsets->push_back(offset);
    offset += n;
  }
  if (data_bytes) *data_bytes = offset;
  std::string text = header.dump();
  while ((8 + text.size()) % 8 != 0) text.push_back(' ');  // keeps the data 8-byte aligned
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((uint64_t(text.size()) >> (8 * i)) & 0xff);
  return out + text;
}

}  // namespace

void write_safetensors(const std::string& path, const std::vector<SafetensorsEntry>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<SafetensorsWriter::Tensor> layout;
  for (const auto& t : tensors) {
    if (nbytes_of(t.dtype, t.shape, path + ": " + t.name) != t.nbytes)
      ftplan::fail_input(path + ": " + t.name + ": byte count does not match dtype and shape " + shape_string(t.shape));
    layout.push_back({t.name, t.dtype, t.shape});
  }
  const std::string head = header_bytes(layout, metadata, path, nullptr, nullptr);

  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) ftplan::fail_input(path + ": cannot create " + tmp + " (" + std::strerror(errno) + ")");
  bool ok = std::fwrite(head.data(), 1, head.size(), f) == head.size();
  for (const auto& t : tensors) {
    if (!ok) break;
    ok = t.nbytes == 0 || std::fwrite(t.data, 1, t.nbytes, f) == t.nbytes;
  }
  ok = (std::fflush(f) == 0) && ok && (::fsync(fileno(f)) == 0);
  ok = (std::fclose(f) == 0) && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string reason = std::strerror(errno);
    std::remove(tmp.c_str());
    throw std::runtime_error(path + ": write failed (" + reason + "); the previous file, if any, is unchanged");
  }
}

SafetensorsWriter::SafetensorsWriter(const std::string& path, const std::vector<Tensor>& layout,
                                     const std::map<std::string, std::string>& metadata)
    : path_(path) {
  std::vector<uint64_t> offsets;
  const std::string head = header_bytes(layout, metadata, path, &offsets, &data_bytes_);
  data_start_ = head.size();
  for (size_t i = 0; i < layout.size(); ++i)
    slots_[layout[i].name] = {layout[i].dtype, offsets[i], nbytes_of(layout[i].dtype, layout[i].shape, path)};
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw std::runtime_error(path + ": cannot create (" + std::strerror(errno) + ")");
  // The whole size up front (allocated where the file system can: a full disk fails here rather
  // than halfway), then the header.
  const off_t total = static_cast<off_t>(data_start_ + data_bytes_);
  int err = total > 0 ? ::posix_fallocate(fd_, 0, total) : 0;
  if (err == EOPNOTSUPP || err == EINVAL) err = ::ftruncate(fd_, total) == 0 ? 0 : errno;
  if (err == 0 && ::pwrite(fd_, head.data(), head.size(), 0) != static_cast<ssize_t>(head.size())) err = errno ? errno : EIO;
  if (err != 0) {
    const std::string reason = std::strerror(err);
    ::close(fd_);
    fd_ = -1;
    throw std::runtime_error(path + ": write failed (" + reason + ")");
  }
}

SafetensorsWriter::~SafetensorsWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void SafetensorsWriter::write(const std::string& name, const std::string& dtype, const void* data, size_t nbytes) {
  const auto it = slots_.find(name);
  if (it == slots_.end()) throw std::runtime_error(path_ + ": tensor " + name + " is not in the file's layout");
  Slot& s = it->second;
  if (s.written) throw std::runtime_error(path_ + ": tensor " + name + " written twice");
  if (dtype != s.dtype || nbytes != s.nbytes)
    throw std::runtime_error(path_ + ": tensor " + name + " is " + dtype + " of " + std::to_string(nbytes) +
                             " bytes, the layout says " + s.dtype + " of " + std::to_string(s.nbytes));
  const char* p = static_cast<const char*>(data);
  uint64_t done = 0;
  while (done < nbytes) {
    const ssize_t n = ::pwrite(fd_, p + done, nbytes - done, static_cast<off_t>(data_start_ + s.offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw std::runtime_error(path_ + ": writing " + name + " failed (" + std::strerror(errno) + ")");
    done += static_cast<uint64_t>(n);
  }
  s.written = true;
}

void SafetensorsWriter::finish() {
  for (const auto& [name, s] : slots_)
    if (!s.written) throw std::runtime_error(path_ + ": tensor " + name + " was never written");
  const bool ok = ::fsync(fd_) == 0;
  const std::string reason = std::strerror(errno);
  const bool closed = ::close(fd_) == 0;
  fd_ = -1;
  if (!ok || !closed) throw std::runtime_error(path_ + ": write failed (" + reason + ")");
}

}  // namespace ftexec
