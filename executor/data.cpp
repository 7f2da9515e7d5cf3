#include "executor/data.h"

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "planner/errors.h"

namespace ftexec {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

class SyntheticSource : public DataSource {
 public:
  SyntheticSource(int64_t vocab_size, uint64_t seed) : vocab_size_(vocab_size), seed_(seed), rng_(seed) {}
  TokenBatch next(int64_t batch, int64_t seq_len) override {
    std::uniform_int_distribution<int64_t> token(0, vocab_size_ - 1);
    std::vector<int64_t> row(seq_len + 1);
    TokenBatch b;
    b.batch = batch;
    b.seq_len = seq_len;
    for (int64_t r = 0; r < batch; ++r) {  // each row its own window of seq_len + 1 tokens
      for (auto& t : row) t = token(rng_);
      b.input_ids.insert(b.input_ids.end(), row.begin(), row.end() - 1);
      b.labels.insert(b.labels.end(), row.begin() + 1, row.end());
    }
    return b;
  }
  std::string describe() const override { return "synthetic (seed " + std::to_string(seed_) + ")"; }

 private:
  int64_t vocab_size_;
  uint64_t seed_;
  std::mt19937_64 rng_;
};

class FileSource : public DataSource {
 public:
  FileSource(std::string path, std::vector<int64_t> tokens) : path_(std::move(path)), tokens_(std::move(tokens)) {}
  TokenBatch next(int64_t batch, int64_t seq_len) override {
    TokenBatch b = pack_batch(tokens_, offset_, batch, seq_len);
    offset_ = (offset_ + batch * seq_len) % static_cast<int64_t>(tokens_.size());
    return b;
  }
  std::string describe() const override { return path_ + ": " + std::to_string(tokens_.size()) + " tokens"; }

 private:
  std::string path_;
  std::vector<int64_t> tokens_;
  int64_t offset_ = 0;
};

void check_token(int64_t id, int64_t vocab_size, const std::string& where) {
  if (id < 0 || id >= vocab_size)
    ftplan::fail_input(where + ": token id " + std::to_string(id) + " outside the vocabulary [0, " +
                       std::to_string(vocab_size) + ")");
}

}  // namespace

std::vector<int64_t> read_token_file(const std::string& path, int64_t vocab_size) {
  std::ifstream in(path, std::ios::binary);
  if (!in) ftplan::fail_input("--data: cannot open " + path);
  std::vector<int64_t> tokens;
  if (ends_with(path, ".jsonl") || ends_with(path, ".json")) {
    std::string line;
    int64_t line_no = 0;
    while (std::getline(in, line)) {
      ++line_no;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      const std::string where = path + ":" + std::to_string(line_no);
      nlohmann::json row;
      try {
        row = nlohmann::json::parse(line);
      } catch (const nlohmann::json::exception& e) {
        ftplan::fail_input(where + ": not JSON (" + e.what() + ")");
      }
      if (!row.is_object() || !row.contains("input_ids") || !row["input_ids"].is_array())
        ftplan::fail_input(where + ": expected an object with an \"input_ids\" array");
      for (const auto& id : row["input_ids"]) {
        if (!id.is_number_integer()) ftplan::fail_input(where + ": input_ids holds a non-integer");
        check_token(id.get<int64_t>(), vocab_size, where);
        tokens.push_back(id.get<int64_t>());
      }
    }
  } else if (ends_with(path, ".bin")) {
    std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (bytes.size() % 4 != 0)
      ftplan::fail_input(path + ": " + std::to_string(bytes.size()) + " bytes is not a whole number of uint32 tokens");
    tokens.resize(bytes.size() / 4);
    for (size_t i = 0; i < tokens.size(); ++i) {
      const auto* p = reinterpret_cast<const unsigned char*>(bytes.data() + 4 * i);
      tokens[i] = int64_t(p[0]) | int64_t(p[1]) << 8 | int64_t(p[2]) << 16 | int64_t(p[3]) << 24;
      check_token(tokens[i], vocab_size, path + ": token " + std::to_string(i));
    }
  } else {
    ftplan::fail_input("--data " + path + ": expected \"synthetic\", a .jsonl file or a .bin file of uint32 tokens");
  }
  if (tokens.size() < 2) ftplan::fail_input(path + ": needs at least 2 tokens, has " + std::to_string(tokens.size()));
  return tokens;
}

TokenBatch pack_batch(const std::vector<int64_t>& tokens, int64_t offset, int64_t batch, int64_t seq_len) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  TokenBatch b;
  b.batch = batch;
  b.seq_len = seq_len;
  b.input_ids.resize(batch * seq_len);
  b.labels.resize(batch * seq_len);
  for (int64_t r = 0; r < batch; ++r) {
    const int64_t start = offset + r * seq_len;  // windows of seq_len + 1 with stride seq_len
    for (int64_t s = 0; s < seq_len; ++s) {
      b.input_ids[r * seq_len + s] = tokens[(start + s) % n];
      b.labels[r * seq_len + s] = tokens[(start + s + 1) % n];
    }
  }
  return b;
}

std::unique_ptr<DataSource> open_data_source(const std::string& spec, int64_t vocab_size, uint64_t seed) {
  if (spec == "synthetic") return std::make_unique<SyntheticSource>(vocab_size, seed);
  return std::make_unique<FileSource>(spec, read_token_file(spec, vocab_size));
}

}  // namespace ftexec
