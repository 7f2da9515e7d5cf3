#include "executor/save_folder.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <stdexcept>

namespace ftexec {
namespace fs = std::filesystem;
namespace {

std::string why() { return std::strerror(errno); }

// fsync of a folder, so a rename or a new entry inside it survives a crash of the machine.
bool sync_folder(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = ::fsync(fd) == 0;
  ::close(fd);
  return ok;
}

std::string trimmed(std::string p) {
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  return p;
}

}  // namespace

SaveFolder::SaveFolder(const std::string& dir) : dir_(trimmed(dir)) {
  std::error_code ec;
  const bool exists = fs::is_directory(dir_, ec);
  const bool empty = exists && fs::is_empty(dir_, ec);
  const std::string tag = ".ftexec-save-" + std::to_string(::getpid());
  whole_ = !exists || empty;
  if (whole_) {
    const fs::path d(dir_);
    const fs::path parent = d.has_parent_path() ? d.parent_path() : fs::path(".");
    tmp_ = (parent / ("." + d.filename().string() + tag)).string();
  } else {
    tmp_ = (fs::path(dir_) / tag).string();
  }
  fs::remove_all(tmp_, ec);  // left by an earlier process of the same id
  if (::mkdir(tmp_.c_str(), 0755) != 0)
    throw std::runtime_error("--save " + dir + ": cannot create the temporary folder " + tmp_ + " (" + why() + ")");
}

SaveFolder::~SaveFolder() {
  if (committed_) return;
  std::error_code ec;
  fs::remove_all(tmp_, ec);
}

std::string SaveFolder::file(const std::string& name) {
  files_.push_back(name);
  return (fs::path(tmp_) / name).string();
}

void SaveFolder::commit() {
  auto fail = [&](const std::string& what) {
    throw std::runtime_error("--save " + dir_ + ": " + what + " (" + why() + "); the folder is unchanged but for the files already moved");
  };
  if (!sync_folder(tmp_)) fail("cannot sync " + tmp_);
  if (whole_) {
    if (std::rename(tmp_.c_str(), dir_.c_str()) == 0) {
      committed_ = true;
      const fs::path d(dir_);
      sync_folder(d.has_parent_path() ? d.parent_path().string() : ".");
      return;
    }
    // DIR appeared, or gained files, since the run began: fall back to moving the files.
    if (errno != ENOTEMPTY && errno != EEXIST) fail("cannot rename " + tmp_ + " to " + dir_);
    std::error_code ec;
    fs::create_directories(dir_, ec);
  }
  for (const auto& name : files_) {
    const std::string from = (fs::path(tmp_) / name).string(), to = (fs::path(dir_) / name).string();
    if (std::rename(from.c_str(), to.c_str()) != 0) fail("cannot move " + from + " to " + to);
  }
  committed_ = true;
  std::error_code ec;
  fs::remove_all(tmp_, ec);
  sync_folder(dir_);
}

}  // namespace ftexec
