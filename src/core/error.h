#pragma once
#include <stdexcept>
#include <string>

namespace dsv4 {

// Every user-facing failure (bad checkpoint, bad flag, bad input) is an Error
// whose message is one line that names the offending file, tensor or field.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace dsv4
