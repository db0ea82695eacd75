// Where a process's cgroup files are, for the limits a container sets (CPU
// quota: core/threads.h; memory: core/memory.h).
#pragma once
#include <functional>
#include <string>
#include <vector>

namespace dsv4 {

// Calls visit(dir, v2) for every directory under `cgroup_root` that may hold
// the files of `controller` ("cpu", "memory") for the cgroups listed in
// `proc_self_cgroup` (the text of /proc/self/cgroup): for a cgroup v2 line
// the unified mounts (root, root/unified), for a v1 line naming the
// controller the mounts in `v1_mounts` (relative to the root). Inside a
// container /proc/self/cgroup often names a path that only exists on the
// host, so every ancestor of the path, down to the mount's root, is
// visited; the caller takes the tightest limit it finds.
void for_each_cgroup_dir(const std::string& cgroup_root, const std::string& proc_self_cgroup,
                         const std::string& controller, const std::vector<std::string>& v1_mounts,
                         const std::function<void(const std::string& dir, bool v2)>& visit);

// The whole text of a small file such as /proc/self/cgroup or /proc/meminfo
// (empty where it cannot be read).
std::string read_proc_file(const std::string& path);

}  // namespace dsv4
