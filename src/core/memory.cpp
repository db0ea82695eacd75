#include "core/memory.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <sstream>

#include "core/cgroup.h"

namespace dsv4 {
namespace {

constexpr int64_t kUnlimited = std::numeric_limits<int64_t>::max();

// A number from a cgroup file; kUnlimited for "max", a missing file or v1's
// "no limit" (a value near INT64_MAX rounded down to the page size).
int64_t read_limit(const std::string& path) {
  std::ifstream f(path);
  std::string word;
  if (!(f >> word) || word == "max") return kUnlimited;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(word.c_str(), &end, 10);
  if (end == word.c_str() || v >= (1ull << 62)) return kUnlimited;
  return int64_t(v);
}

}  // namespace

int64_t meminfo_available_bytes(const std::string& text) {
  std::stringstream lines(text);
  std::string key;
  int64_t kib = 0;
  std::string line;
  while (std::getline(lines, line)) {
    std::stringstream fields(line);
    if (fields >> key >> kib && key == "MemAvailable:") return kib * 1024;
  }
  return -1;
}

int64_t cgroup_memory_room(const std::string& root, const std::string& proc_self_cgroup) {
  int64_t room = kUnlimited;
  for_each_cgroup_dir(root, proc_self_cgroup, "memory", {"memory"}, [&](const std::string& dir, bool v2) {
    const int64_t limit = read_limit(dir + (v2 ? "/memory.max" : "/memory.limit_in_bytes"));
    if (limit == kUnlimited) return;
    const int64_t usage = read_limit(dir + (v2 ? "/memory.current" : "/memory.usage_in_bytes"));
    room = std::min(room, usage == kUnlimited ? limit : std::max<int64_t>(0, limit - usage));
  });
  return room;
}

int64_t available_memory_bytes() {
  const int64_t available = meminfo_available_bytes(read_proc_file("/proc/meminfo"));
  const int64_t room = cgroup_memory_room("/sys/fs/cgroup", read_proc_file("/proc/self/cgroup"));
  if (available < 0) return room == kUnlimited ? -1 : room;
  return std::min(available, room);
}

}  // namespace dsv4
