// Safetensors files (https://github.com/huggingface/safetensors, "Format"): an 8-byte little-endian
// header length N, N bytes of JSON {"<name>": {"dtype": "BF16", "shape": [..], "data_offsets":
// [begin, end]}, "__metadata__": {"format": "pt"}} padded with spaces, then the raw little-endian
// tensor bytes; offsets are relative to the end of the header. No LibTorch here: the model code
// turns these byte ranges into tensors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace ftexec {

// Bytes of one element of a safetensors dtype ("F32" 4, "BF16" 2, "F16" 2, "F64" 8, "I64" 8, "I32" 4,
// "U8" 1, "BOOL" 1); an InputError for others.
size_t safetensors_dtype_bytes(const std::string& dtype, const std::string& where);

struct SafetensorsEntry {
  std::string name;           // e.g. "model.layers.0.self_attn.q_proj.weight"
  std::string dtype;          // "F32", "BF16", "F16", ...
  std::vector<int64_t> shape; // e.g. {2048, 2048}
  const void* data = nullptr; // inside the mapped file
  size_t nbytes = 0;
};

// A file opened read-only and memory-mapped; validated once on open (header length, JSON, dtypes,
// shapes against byte ranges, ranges inside the file and not overlapping). Errors are InputErrors
// naming the file and the tensor.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }  // in file order
  const SafetensorsEntry* find(const std::string& name) const;               // nullptr if absent
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  std::string path_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

// Writes tensors (data read from the given pointers) to `path` atomically: a temporary file in the
// same folder, fsync, then rename. Tensors are laid out in the order given.
void write_safetensors(const std::string& path, const std::vector<SafetensorsEntry>& tensors,
                       const std::map<std::string, std::string>& metadata = {{"format", "pt"}});

// Writes one safetensors file tensor by tensor, in any order, without holding them all (--save of a
// sharded or pipelined model, one unit at a time): the header of every tensor (the layout, in file
// order, as write_safetensors lays it out: the same bytes for the same tensors) goes first, each
// tensor's bytes to their offset as they arrive. The file is written at `path` itself (the caller
// writes it inside a temporary folder); finish() checks every tensor arrived once and fsyncs.
// std::runtime_error naming the file and tensor on any failure.
class SafetensorsWriter {
 public:
  struct Tensor {
    std::string name;           // e.g. "model.layers.0.mlp.up_proj.weight"
    std::string dtype;          // "F32", "BF16", ...
    std::vector<int64_t> shape;
  };
  SafetensorsWriter(const std::string& path, const std::vector<Tensor>& layout,
                    const std::map<std::string, std::string>& metadata = {{"format", "pt"}});
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // The bytes of tensor `name` (its layout's dtype and shape: nbytes must match).
  void write(const std::string& name, const std::string& dtype, const void* data, size_t nbytes);
  void finish();
  uint64_t file_bytes() const { return data_start_ + data_bytes_; }

 private:
  std::string path_;
  int fd_ = -1;
  struct Slot {
    std::string dtype;
    uint64_t offset = 0, nbytes = 0;
    bool written = false;
  };
  std::map<std::string, Slot> slots_;
  uint64_t data_start_ = 0, data_bytes_ = 0;
};

}  // namespace ftexec
