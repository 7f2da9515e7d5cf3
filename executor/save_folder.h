// --save DIR: the folder a run writes at its end (the PEFT adapter or the full weights, and their
// config), written so that DIR never holds half of it. No LibTorch here.
//   DIR does not exist, or is empty   a temporary folder beside it (<parent>/.<name>.ftexec-save-<pid>)
//                                     is filled, its files and itself fsynced, and renamed to DIR in one
//                                     step (rename(2) replaces an empty folder), then the parent is
//                                     fsynced: DIR appears whole or not at all
//   DIR holds files                   the temporary folder is made inside DIR (DIR/.ftexec-save-<pid>),
//                                     filled and fsynced, then each file is renamed over its namesake
//                                     in DIR in the order they were created (weights before their
//                                     config) and the temporary folder removed: every file is replaced
//                                     whole, and files ftexec does not write are left alone
// A run that fails before commit() leaves DIR as it was (the destructor removes the temporary folder).
// main.cpp checks DIR before any work (ftplan::check_output_dir): an existing writable folder, or a
// name in a writable folder.
#pragma once

#include <string>
#include <vector>

namespace ftexec {

class SaveFolder {
 public:
  // Creates the temporary folder. std::runtime_error naming --save, DIR and the system's reason.
  explicit SaveFolder(const std::string& dir);
  ~SaveFolder();
  SaveFolder(const SaveFolder&) = delete;
  SaveFolder& operator=(const SaveFolder&) = delete;

  // Where to write file `name` (inside the temporary folder); commit() moves the files in this order.
  std::string file(const std::string& name);
  // Moves everything into DIR (see above). std::runtime_error on failure.
  void commit();

  const std::string& dir() const { return dir_; }
  const std::vector<std::string>& files() const { return files_; }

 private:
  std::string dir_, tmp_;
  bool whole_ = false;      // the temporary folder becomes DIR (DIR absent or empty)
  bool committed_ = false;
  std::vector<std::string> files_;
};

}  // namespace ftexec
