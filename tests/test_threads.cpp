// The default team size follows the CPUs a container may use, not the
// host's CPU count: a docker --cpus=2 container on a 64-core host must not
// start 64 compute threads.
#include <gtest/gtest.h>
#include <omp.h>
#include <sched.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "core/threads.h"
#include "fake_cgroup_tree.h"
#include "run_command.h"

namespace fs = std::filesystem;
using namespace dsv4;
using dsv4::test::CommandResult;
using dsv4::test::run_command;
using test::FakeCgroupTree;

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

// With OpenMP placing the threads, libgomp binds the main thread to its
// first place before any of our code runs; the usable CPUs must still be all
// of the process's (they were one, and every team had one thread). The
// variables are read when libgomp loads, so a child process of this test
// binary reports its count under each of them.
TEST(Threads, OpenMpPlacementKeepsEveryCpu) {
  if (std::getenv("DSV4_THREADS_CHILD")) {
    std::printf("usable cpus: %d\n", usable_cpu_count());
    return;
  }
  const std::string self = fs::read_symlink("/proc/self/exe").string();
  for (const char* placement : {"OMP_PROC_BIND=true", "OMP_PLACES=cores", "OMP_PROC_BIND=close OMP_PLACES=threads"}) {
    const std::string command = std::string("env ") + placement + " DSV4_THREADS_CHILD=1 '" + self +
                                "' --gtest_filter=Threads.OpenMpPlacementKeepsEveryCpu";
    const CommandResult child = run_command(command);
    ASSERT_EQ(child.exit_code, 0) << child.output;
    const size_t at = child.output.find("usable cpus: ");
    ASSERT_NE(at, std::string::npos) << child.output;
    EXPECT_EQ(std::atoi(child.output.c_str() + at + 13), usable_cpu_count()) << placement;
  }
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

// The model thread's team is pinned one thread per CPU, in the affinity
// mask's order, and the same threads come back pinned in later regions.
// Run on a thread of its own, whose OpenMP team ends with it.
TEST(Threads, PinningPutsEachTeamThreadOnItsOwnCpu) {
  const char* saved = std::getenv("OMP_PROC_BIND");
  const std::string saved_value = saved ? saved : "";
  ::unsetenv("OMP_PROC_BIND");  // (libgomp read it at start-up; only our check reads it now)
  ::unsetenv("OMP_PLACES");
  ::unsetenv("GOMP_CPU_AFFINITY");
  cpu_set_t mask;
  ASSERT_EQ(sched_getaffinity(0, sizeof(mask), &mask), 0);
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &mask)) cpus.push_back(c);
  if (usable_cpu_count() < int(cpus.size()))
    GTEST_SKIP() << "a CPU quota narrower than the affinity mask: pinning is off by design here";
  const int threads = std::min<int>(2, int(cpus.size()));
  bool pinned = false;
  std::vector<int> seen(size_t(threads), -1), counts(size_t(threads), 0);
  std::thread([&] {
    set_compute_threads(threads);
    pinned = pin_compute_threads();
    for (int region = 0; region < 2; ++region) {
#pragma omp parallel num_threads(threads)
      {
        cpu_set_t own;
        sched_getaffinity(0, sizeof(own), &own);
        const int id = omp_get_thread_num();
        counts[size_t(id)] = CPU_COUNT(&own);
        for (int c = 0; c < CPU_SETSIZE; ++c)
          if (CPU_ISSET(c, &own)) seen[size_t(id)] = c;
      }
    }
  }).join();
  set_compute_threads(0);
  EXPECT_TRUE(pinned);
  for (int i = 0; i < threads; ++i) {
    EXPECT_EQ(counts[size_t(i)], 1) << "thread " << i;
    EXPECT_EQ(seen[size_t(i)], cpus[size_t(i)]) << "thread " << i;
  }
  // A placement the user asked for is left alone.
  ::setenv("OMP_PROC_BIND", "false", 1);
  EXPECT_EQ(pinning_refusal(), "placed as OMP_PROC_BIND says");
  bool pinned_anyway = true;
  std::thread([&] { pinned_anyway = pin_compute_threads(); }).join();
  EXPECT_FALSE(pinned_anyway);
  if (saved)
    ::setenv("OMP_PROC_BIND", saved_value.c_str(), 1);
  else
    ::unsetenv("OMP_PROC_BIND");
}

namespace {

// Threads of this process (/proc/self/task).
int process_threads() {
  int n = 0;
  for ([[maybe_unused]] const auto& entry : fs::directory_iterator("/proc/self/task")) ++n;
  return n;
}

// Polls until the process has `want` threads (a worker that was told to
// exit may take a moment); returns the last count seen.
int wait_for_threads(int want) {
  int n = process_threads();
  for (int i = 0; i < 200 && n != want; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    n = process_threads();
  }
  return n;
}

}  // namespace

// A thread's released team: its workers exit (so that they stop counting
// against another thread's team, docs/engine.md), and its next parallel
// region starts a working team again. On a thread of its own, so that no
// other test's team is involved.
TEST(Threads, ReleasedTeamsWorkersExitAndTheNextRegionStartsANewTeam) {
  std::thread([] {
    const int before = process_threads();
    int team = 0;
#pragma omp parallel num_threads(3)
    {
#pragma omp single
      team = omp_get_num_threads();
    }
    ASSERT_EQ(team, 3);
    EXPECT_EQ(wait_for_threads(before + 2), before + 2);  // two workers wait for the next region
    bool inside = true;
#pragma omp parallel num_threads(3)
    {
#pragma omp single
      inside = release_thread_team();
    }
    EXPECT_FALSE(inside) << "inside a parallel region nothing is released";
    EXPECT_EQ(process_threads(), before + 2);
    EXPECT_TRUE(release_thread_team());
    EXPECT_EQ(wait_for_threads(before), before);
    int sum = 0;
#pragma omp parallel num_threads(3) reduction(+ : sum)
    sum += omp_get_thread_num() + 1;
    EXPECT_EQ(sum, 1 + 2 + 3);
    EXPECT_TRUE(release_thread_team());
    EXPECT_EQ(wait_for_threads(before), before);
  }).join();
}
