// Checkpoint directories on disk: the manifest that commits a checkpoint, its verification on
// --resume, the choice of the checkpoint to resume from, and rotation (--keep-last). No LibTorch
// here: dist_run.cpp writes and reads the tensors, this file only sees files and bytes.
//
// Layout of --checkpoint-dir DIR:
//   DIR/step-<S>/rank-<r>.safetensors  what rank r owns after S optimizer steps (replicated strategies:
//                                      rank 0 alone)
//   DIR/step-<S>/rank-<r>.json         rank r's step, optimizer step count, data position, RNG state
//   DIR/step-<S>/manifest.json         written by rank 0 last, once every rank's files are in place:
//                                      the commit point. A step-<S> without it is incomplete (a run
//                                      that stopped while writing it) and is never resumed from.
//   DIR/latest                         "step-<S>\n", the newest complete checkpoint (for people and
//                                      scripts; --resume takes the newest complete step-<S> itself)
//
// manifest.json ("format": "ftexec-checkpoint/2"):
//   {"format", "step": 4, "world_size": 2, "model": "tiny-test" (for people),
//    "layout": {"strategy", "method", "precision", "micro_batch", "grad_accum", "seed",
//               "load_weights", "model_config_crc32", ["lora": {rank, alpha, targets}],
//               ["shard_group_size"]},   // everything that decides what each rank's files hold
//    "checksum": "crc32",
//    "files": {"rank-0.safetensors": {"bytes": 1234, "crc32": "1a2b3c4d"}, "rank-0.json": {...}, ...}}
//
// Checksum: CRC-32 of the whole file by zlib (zlib1g-dev). What it guards against is accidental:
// flipped or lost bytes, truncation, a shard of another rank or run put in place. CRC-32 detects
// every burst of up to 32 flipped bits and misses a random change with probability 2^-32, and the
// byte count is checked beside it. Measured here (AVX-512 CPU, 256 MiB in memory): zlib's crc32
// 7.1 GB/s, OpenSSL's SHA-256 (with SHA-NI) 2.0 GB/s; a cryptographic hash would only add protection
// against deliberate forgery, which a checkpoint on one's own disk does not need. Anyone can check a
// file by hand: python3 -c 'import sys,zlib;print("%08x"%zlib.crc32(open(sys.argv[1],"rb").read()))' F
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace ftexec {

inline constexpr const char* kCheckpointFormat = "ftexec-checkpoint/2";

struct FileDigest {
  int64_t bytes = 0;   // file size, e.g. 1048576
  uint32_t crc32 = 0;  // zlib's crc32 of every byte of the file
};

// Reads the whole file once. std::runtime_error naming the file when it cannot be read.
FileDigest file_digest(const std::string& path);
// The CRC-32 of a string (e.g. a model config's JSON), as 8 lowercase hex digits.
std::string crc32_hex(const std::string& bytes);
std::string crc32_hex(uint32_t crc);

// Writes `text` to `path` so that it survives a crash of the process or the machine: a temporary
// file in the same folder, fsync, rename, fsync of the folder. std::runtime_error on failure (the
// previous file, if any, is unchanged).
void write_file_durably(const std::string& path, const std::string& text);

// The manifest of the checkpoint after `step` optimizer steps. `files`: every file of the checkpoint
// (name inside step-<S>/ -> digest).
nlohmann::json checkpoint_manifest(int64_t step, int world_size, const std::string& model, const nlohmann::json& layout,
                                   const std::map<std::string, FileDigest>& files);

// How a manifest differs from this run: one entry per differing field, e.g.
// "world_size: checkpoint 4, this run 2", "strategy: checkpoint \"zero3\", this run \"ddp\"".
// Empty when this run can resume from it. Also checks the format and that the manifest's step is
// the one its folder is named after (`folder_step`).
std::vector<std::string> checkpoint_layout_differences(const nlohmann::json& manifest, int64_t folder_step,
                                                       int world_size, const nlohmann::json& layout);

// "" when `folder`/`file` has the size and CRC-32 the manifest lists; else one line naming the file
// and what differs, e.g. "DIR/step-4/rank-1.safetensors: crc32 1a2b3c4d != manifest 3c4d5e6f
// (corrupted, or from another checkpoint)". Reads the file once.
std::string checkpoint_file_problem(const nlohmann::json& manifest, const std::string& folder, const std::string& file);

// One step-<S> folder of a checkpoint directory.
struct CheckpointFolder {
  int64_t step = 0;       // S
  std::string path;       // DIR/step-<S>
  bool complete = false;  // has manifest.json
};
// Every step-<S> folder of DIR, by step, oldest first; none when DIR does not exist.
std::vector<CheckpointFolder> checkpoint_folders(const std::string& dir);

struct CheckpointChoice {
  CheckpointFolder folder;
  std::string note;  // for the user when it is not simply the newest folder, e.g. "DIR/step-6 is incomplete
                     // (no manifest.json: the run stopped while writing it); resuming from DIR/step-4"
};
// The checkpoint --resume continues from: the newest complete step-<S> of DIR. InputError naming
// DIR (and any incomplete folder) when there is none.
CheckpointChoice checkpoint_choose(const std::string& dir);

// Checks before a run starts, on the launcher and on every rank (all see the same files, so all
// reach the same verdict): DIR can be created; --resume: there is a complete checkpoint to continue
// from; a fresh run: DIR holds no complete checkpoint (it would mix two runs' checkpoints, and
// --keep-last would then remove the other run's trained weights). InputError naming the flag.
void checkpoint_preflight(const std::string& dir, bool resume);

// --keep-last N: removes the complete step-<S> folders beyond the newest N and the incomplete ones
// older than the newest complete one, never the one DIR/latest names. Each complete folder loses its
// manifest first, so one half removed is incomplete, never a damaged "complete" checkpoint.
// Returns the folders removed; those it could not remove go to `failed` as "PATH (reason)" (they
// do not stop the run).
std::vector<std::string> checkpoint_rotate(const std::string& dir, int64_t keep_last,
                                           std::vector<std::string>* failed = nullptr);

}  // namespace ftexec
