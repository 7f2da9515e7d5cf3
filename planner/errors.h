// The one error type for bad input: a message that names the field (and the file where there is
// one). The CLIs catch it, print it on one line and exit with code 2.
#pragma once

#include <stdexcept>
#include <string>

namespace ftplan {

struct InputError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

[[noreturn]] inline void fail_input(const std::string& message) { throw InputError(message); }

}  // namespace ftplan
