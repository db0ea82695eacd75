// The memory a process may still take (core/memory.h), which decides
// whether `--load-mode auto` copies the weights: MemAvailable, capped by a
// container's cgroup memory limit minus its usage.
#include <gtest/gtest.h>

#include <limits>
#include <string>

#include "core/memory.h"
#include "fake_cgroup_tree.h"

using namespace dsv4;
using test::FakeCgroupTree;

namespace {

constexpr int64_t kUnlimited = std::numeric_limits<int64_t>::max();

}  // namespace

TEST(Memory, MemAvailableIsReadInBytes) {
  EXPECT_EQ(meminfo_available_bytes("MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:   22000000 kB\n"),
            int64_t(22000000) * 1024);
  EXPECT_EQ(meminfo_available_bytes("MemTotal: 1 kB\n"), -1);
  EXPECT_GT(available_memory_bytes(), 0);  // this machine has /proc/meminfo
}

// cgroup v2: the room is memory.max - memory.current of the process's
// cgroup or an ancestor (a container sees its own cgroup as the root).
TEST(Memory, CgroupV2LimitMinusUsage) {
  FakeCgroupTree t;
  EXPECT_EQ(cgroup_memory_room(t.root.string(), "0::/\n"), kUnlimited);
  t.write("memory.max", "max\n");
  EXPECT_EQ(cgroup_memory_room(t.root.string(), "0::/\n"), kUnlimited);
  t.write("docker/abc/memory.max", "8589934592\n");
  t.write("docker/abc/memory.current", "1073741824\n");
  EXPECT_EQ(cgroup_memory_room(t.root.string(), "0::/docker/abc\n"), int64_t(7) << 30);
  // Usage above the limit leaves no room (never negative).
  t.write("docker/abc/memory.current", "9000000000\n");
  EXPECT_EQ(cgroup_memory_room(t.root.string(), "0::/docker/abc\n"), 0);
}

// cgroup v1: memory.limit_in_bytes - memory.usage_in_bytes under the memory
// mount; v1's "no limit" (near INT64_MAX) counts as none.
TEST(Memory, CgroupV1LimitMinusUsage) {
  FakeCgroupTree t;
  t.write("memory/memory.limit_in_bytes", "9223372036854771712\n");
  EXPECT_EQ(cgroup_memory_room(t.root.string(), "4:memory:/\n"), kUnlimited);
  t.write("memory/job/memory.limit_in_bytes", "4294967296\n");
  t.write("memory/job/memory.usage_in_bytes", "1073741824\n");
  EXPECT_EQ(cgroup_memory_room(t.root.string(), "4:memory:/job\n3:cpu,cpuacct:/job\n"), int64_t(3) << 30);
  // A line for other controllers only is not read.
  EXPECT_EQ(cgroup_memory_room(t.root.string(), "3:cpu,cpuacct:/job\n"), kUnlimited);
}
