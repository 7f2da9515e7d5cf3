// Writing what a command produces (ftplan -o and --trace, ftexec --out and --save, checkpoints),
// so that a run that dies loses nothing already written and never leaves half a file:
//   "-"                          standard output
//   a regular file or a new name atomically: a temporary file beside the target, fsync, rename over
//                                it (an existing file keeps its permission bits), fsync of the folder
//   a symbolic link              its final target is written (atomically when it is a regular file or
//                                does not exist yet); the link itself stays a link
//   a FIFO, a device, a socket, /dev/stdout, /proc/self/fd/N
//                                written in place (opened for appending, no temporary, no rename)
// Errors are InputErrors naming `field` (the flag, e.g. "-o"), the path and the system's reason.
#pragma once

#include <string>

namespace ftplan {

void write_output(const std::string& path, const std::string& text, const std::string& field);

// Checks, before any work, that write_output(path, ...) can succeed: the folder exists and is
// writable, the path is not a folder, a special file is writable. InputError naming `field`.
void check_output_path(const std::string& path, const std::string& field);

// The same for an output folder (ftexec --save DIR, --checkpoint-dir DIR): an existing writable
// folder, or a name whose parent folder exists and is writable.
void check_output_dir(const std::string& path, const std::string& field);

}  // namespace ftplan
