#include "planner/output_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <iostream>

#include "planner/errors.h"

namespace ftplan {
namespace {

[[noreturn]] void fail_write(const std::string& field, const std::string& path, const std::string& why) {
  fail_input(field + ": " + path + ": " + why);
}

std::string system_error() { return std::strerror(errno); }

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

std::string parent_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

std::string base_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// What a path names once its symbolic links are followed.
struct Target {
  std::string path;         // the final name (the original path when written in place)
  bool exists = false;
  bool in_place = false;    // a FIFO, device, socket or a /proc/self/fd, /dev/fd link: write directly
  bool is_dir = false;
  mode_t mode = 0;          // permission bits of an existing regular file
};

Target resolve(const std::string& path, const std::string& field) {
  if (path.empty()) fail_input(field + ": empty path");
  Target t;
  std::string p = path;
  for (int hop = 0; hop < 40; ++hop) {
    // Descriptor links (/dev/stdout -> /proc/self/fd/1 -> pipe:[...]) name an open file, not a path
    // that could be replaced: write through the original name.
    if (starts_with(p, "/proc/") || starts_with(p, "/dev/fd/")) {
      t.path = path;
      t.exists = true;
      t.in_place = true;
      return t;
    }
    struct stat st;
    if (::lstat(p.c_str(), &st) != 0) {
      if (errno != ENOENT) fail_write(field, p, system_error());
      t.path = p;  // a new file (or the missing target of a dangling link)
      return t;
    }
    if (!S_ISLNK(st.st_mode)) {
      t.path = p;
      t.exists = true;
      t.is_dir = S_ISDIR(st.st_mode);
      t.in_place = !S_ISREG(st.st_mode) && !t.is_dir;
      t.mode = st.st_mode & 07777;
      return t;
    }
    char buf[PATH_MAX];
    const ssize_t n = ::readlink(p.c_str(), buf, sizeof buf - 1);
    if (n < 0) fail_write(field, p, system_error());
    std::string next(buf, static_cast<size_t>(n));
    p = (!next.empty() && next[0] == '/') ? next : parent_of(p) + "/" + next;
  }
  fail_write(field, path, "too many levels of symbolic links");
}

void write_all(int fd, const std::string& text, const std::string& field, const std::string& path) {
  const char* data = text.data();
  size_t left = text.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, data, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail_write(field, path, "write failed: " + system_error());
    data += n;
    left -= static_cast<size_t>(n);
  }
}

void write_in_place(const std::string& path, const std::string& text, const std::string& field) {
  std::cout.flush();  // what was printed before stays before (ftplan plan -o /dev/stdout)
  const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  if (fd < 0) fail_write(field, path, "cannot open for writing: " + system_error());
  try {
    write_all(fd, text, field, path);
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
}

void write_replacing(const Target& t, const std::string& text, const std::string& field) {
  static std::atomic<unsigned> counter{0};
  const std::string dir = parent_of(t.path);
  std::string tmp;
  int fd = -1;
  for (int attempt = 0; attempt < 100 && fd < 0; ++attempt) {
    tmp = dir + "/." + base_of(t.path) + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
    fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);  // 0666 & ~umask, as `>` makes
    if (fd < 0 && errno != EEXIST) fail_write(field, t.path, "cannot create a temporary file in " + dir + ": " + system_error());
  }
  if (fd < 0) fail_write(field, t.path, "cannot create a temporary file in " + dir);
  try {
    write_all(fd, text, field, t.path);
    if (t.exists && ::fchmod(fd, t.mode) != 0) fail_write(field, t.path, "cannot keep its permissions: " + system_error());
    if (::fsync(fd) != 0) fail_write(field, t.path, "fsync failed: " + system_error());
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  if (::close(fd) != 0) {
    ::unlink(tmp.c_str());
    fail_write(field, t.path, "close failed: " + system_error());
  }
  if (::rename(tmp.c_str(), t.path.c_str()) != 0) {
    const std::string why = system_error();
    ::unlink(tmp.c_str());
    fail_write(field, t.path, "cannot rename the temporary file into place: " + why);
  }
  // The rename is durable once the folder is on disk too.
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

void require_writable_folder(const std::string& dir, const std::string& field, const std::string& path) {
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) fail_write(field, path, "folder " + dir + " does not exist");
  if (!S_ISDIR(st.st_mode)) fail_write(field, path, dir + " is not a folder");
  if (::access(dir.c_str(), W_OK | X_OK) != 0) fail_write(field, path, "folder " + dir + " is not writable");
}

}  // namespace

void write_output(const std::string& path, const std::string& text, const std::string& field) {
  if (path == "-") {
    std::cout << text;
    std::cout.flush();
    if (!std::cout) fail_input(field + ": standard output: write failed");
    return;
  }
  const Target t = resolve(path, field);
  if (t.is_dir) fail_write(field, path, "is a folder");
  if (t.in_place) write_in_place(path, text, field);
  else write_replacing(t, text, field);
}

void check_output_path(const std::string& path, const std::string& field) {
  if (path == "-") return;
  const Target t = resolve(path, field);
  if (t.is_dir) fail_write(field, path, "is a folder");
  if (t.in_place) {
    if (::access(path.c_str(), W_OK) != 0) fail_write(field, path, "not writable: " + system_error());
    return;
  }
  require_writable_folder(parent_of(t.path), field, path);
  if (t.exists && ::access(t.path.c_str(), W_OK) != 0) fail_write(field, path, "not writable: " + system_error());
}

void check_output_dir(const std::string& path, const std::string& field) {
  if (path.empty()) fail_input(field + ": empty path");
  struct stat st;
  if (::stat(path.c_str(), &st) == 0) {
    if (!S_ISDIR(st.st_mode)) fail_write(field, path, "exists and is not a folder");
    if (::access(path.c_str(), W_OK | X_OK) != 0) fail_write(field, path, "folder is not writable");
    return;
  }
  std::string trimmed = path;
  while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
  require_writable_folder(parent_of(trimmed), field, path);
}

}  // namespace ftplan
