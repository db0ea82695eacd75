// Runs a shell command line as a child process and collects what it writes
// to standard output: the tests that drive the `dsv4` binary the way external
// harnesses do, and those that re-run their own binary under another
// environment.
#pragma once
#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace dsv4::test {

struct CommandResult {
  // The child's exit status; -1 when it could not be started or did not exit
  // by itself (killed by a signal), so that no such run passes for exit 0.
  int exit_code;
  std::string output;  // its standard output (and stderr where the command redirects it there)
};

inline CommandResult run_command(const std::string& command) {
  CommandResult result{-1, {}};
  FILE* child = popen(command.c_str(), "r");
  if (!child) return result;
  char buffer[65536];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), child)) > 0) result.output.append(buffer, n);
  const int status = pclose(child);
  if (status != -1 && WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  return result;
}

}  // namespace dsv4::test
