// How much memory this process may still take: what decides whether the
// weights are copied into huge pages or mapped (io/residency.h).
#pragma once
#include <cstdint>
#include <string>

namespace dsv4 {

// MemAvailable of /proc/meminfo, capped by the tightest cgroup memory limit
// minus that cgroup's usage (a container's --memory); -1 when unknown.
int64_t available_memory_bytes();

// Exposed for tests: MemAvailable in bytes from the text of /proc/meminfo
// (-1 if absent), and the least room (limit - usage, at least 0) that the
// cgroup hierarchy under `cgroup_root` leaves the cgroups listed in
// `proc_self_cgroup` (v2 memory.max / memory.current, v1
// memory.limit_in_bytes / memory.usage_in_bytes; INT64_MAX when unlimited).
int64_t meminfo_available_bytes(const std::string& meminfo_text);
int64_t cgroup_memory_room(const std::string& cgroup_root, const std::string& proc_self_cgroup);

}  // namespace dsv4
