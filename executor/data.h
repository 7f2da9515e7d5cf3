// Training data as token batches: synthetic tokens from a seed (benchmarking), or pre-tokenized
// files packed to seq_len. No LibTorch: the trainer turns a TokenBatch into tensors.
//   --data synthetic        uniform random token ids in [0, vocab), a fresh batch every call
//   --data PATH.jsonl       one JSON object per line with "input_ids": [..] (as HF tokenizers write)
//   --data PATH.bin         a flat little-endian uint32 array of token ids
// Files are concatenated into one stream and cut into windows of seq_len + 1 tokens with stride
// seq_len: inputs are the first seq_len tokens and labels the next ones (already shifted, so the
// loss needs no slicing). The stream wraps around when it runs out (another epoch).
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace ftexec {

struct TokenBatch {
  int64_t batch = 0;              // B, e.g. 4
  int64_t seq_len = 0;            // S, e.g. 2048
  std::vector<int64_t> input_ids; // B*S, row-major
  std::vector<int64_t> labels;    // B*S, input_ids shifted left by one
};

class DataSource {
 public:
  virtual ~DataSource() = default;
  virtual TokenBatch next(int64_t batch, int64_t seq_len) = 0;
  virtual std::string describe() const = 0;  // e.g. "synthetic (seed 0)", "data.jsonl: 1234567 tokens"
};

// "synthetic" or a path (.jsonl / .json for JSONL, .bin for uint32); token ids are checked against
// vocab_size. Errors are InputErrors naming the file and the line.
std::unique_ptr<DataSource> open_data_source(const std::string& spec, int64_t vocab_size, uint64_t seed);

// The token stream of a file, exposed for tests.
std::vector<int64_t> read_token_file(const std::string& path, int64_t vocab_size);

// Packs a stream into one batch starting at token `offset` (wrapping around).
TokenBatch pack_batch(const std::vector<int64_t>& tokens, int64_t offset, int64_t batch, int64_t seq_len);

}  // namespace ftexec
