// The default team size follows the CPUs a container may use, not the
// host's CPU count: a docker --cpus=2 container on a 64-core host must not
// start 64 compute threads.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <unistd.h>
#include <string>

#include "core/threads.h"

namespace fs = std::filesystem;
using namespace dsv4;

namespace {

struct FakeCgroupTree {
  fs::path root;
  FakeCgroupTree() {
    root = fs::temp_directory_path() / ("dsv4-cgroup-" + std::to_string(::getpid()) + "-" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root);
  }
  ~FakeCgroupTree() { fs::remove_all(root); }
  void write(const std::string& rel, const std::string& text) {
    fs::path p = root / rel;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
  }
};

}  // namespace

TEST(Threads, CgroupV2QuotaIsRoundedCpus) {
  FakeCgroupTree t;
  t.write("cpu.max", "250000 100000\n");
  EXPECT_DOUBLE_EQ(2.5, cgroup_cpu_limit(t.root.string(), "0::/\n"));
}

TEST(Threads, CgroupV2UnlimitedIsInfinite) {
  FakeCgroupTree t;
  t.write("cpu.max", "max 100000\n");
  EXPECT_TRUE(std::isinf(cgroup_cpu_limit(t.root.string(), "0::/\n")));
}

// The tightest limit on the path wins, and a path that exists only on the
// host (a container's view) falls back to the mount's root.
TEST(Threads, CgroupV2TightestAncestorWins) {
  FakeCgroupTree t;
  t.write("cpu.max", "800000 100000\n");
  t.write("docker/abc/cpu.max", "200000 100000\n");
  EXPECT_DOUBLE_EQ(2.0, cgroup_cpu_limit(t.root.string(), "0::/docker/abc\n"));
  EXPECT_DOUBLE_EQ(8.0, cgroup_cpu_limit(t.root.string(), "0::/host/only/path\n"));
}

TEST(Threads, CgroupV1CfsQuota) {
  FakeCgroupTree t;
  t.write("cpu,cpuacct/cpu.cfs_quota_us", "150000\n");
  t.write("cpu,cpuacct/cpu.cfs_period_us", "100000\n");
  const std::string self = "12:memory:/x\n4:cpu,cpuacct:/\n1:name=systemd:/\n";
  EXPECT_DOUBLE_EQ(1.5, cgroup_cpu_limit(t.root.string(), self));
  t.write("cpu,cpuacct/cpu.cfs_quota_us", "-1\n");  // unlimited
  EXPECT_TRUE(std::isinf(cgroup_cpu_limit(t.root.string(), self)));
}

// A path without a leading slash (seen in odd sandboxes) ends at the mount's
// root instead of looping.
TEST(Threads, RelativeCgroupPathEndsAtTheRoot) {
  FakeCgroupTree t;
  t.write("cpu.max", "300000 100000\n");
  t.write("box/cpu.max", "100000 100000\n");
  EXPECT_DOUBLE_EQ(1.0, cgroup_cpu_limit(t.root.string(), "0::box\n"));
  EXPECT_DOUBLE_EQ(3.0, cgroup_cpu_limit(t.root.string(), "0::elsewhere\n"));
  EXPECT_DOUBLE_EQ(3.0, cgroup_cpu_limit(t.root.string(), "0::\n"));
}

TEST(Threads, NoCgroupFilesMeansNoLimit) {
  FakeCgroupTree t;
  EXPECT_TRUE(std::isinf(cgroup_cpu_limit(t.root.string(), "0::/\n4:cpu:/\n")));
  EXPECT_TRUE(std::isinf(cgroup_cpu_limit(t.root.string(), "garbage without colons\n")));
}

TEST(Threads, ExplicitCountOverridesAndZeroRestoresTheDefault) {
  const int before = compute_threads();
  EXPECT_GE(usable_cpu_count(), 1);
  set_compute_threads(5);
  EXPECT_EQ(5, compute_threads());
  EXPECT_EQ(5, threads_for(kMinParallelWork));
  EXPECT_EQ(1, threads_for(kMinParallelWork - 1));
  set_compute_threads(0);
  EXPECT_EQ(before, compute_threads());
}
