#include "core/threads.h"

#include <omp.h>
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/cgroup.h"

namespace dsv4 {
namespace {

// CPUs allowed by a quota file's numbers; infinity when unlimited.
double quota_cpus(double quota_us, double period_us) {
  if (quota_us <= 0 || period_us <= 0) return std::numeric_limits<double>::infinity();
  return quota_us / period_us;
}

double read_v2_limit(const std::string& dir) {
  std::ifstream f(dir + "/cpu.max");
  std::string quota;
  double period = 0;
  if (!(f >> quota >> period) || quota == "max") return std::numeric_limits<double>::infinity();
  return quota_cpus(std::atof(quota.c_str()), period);
}

double read_v1_limit(const std::string& dir) {
  std::ifstream q(dir + "/cpu.cfs_quota_us"), p(dir + "/cpu.cfs_period_us");
  double quota = 0, period = 0;
  if (!(q >> quota) || !(p >> period)) return std::numeric_limits<double>::infinity();
  return quota_cpus(quota, period);
}

// The CPUs of the calling thread's affinity mask, in order (empty if it
// cannot be read).
std::vector<int> thread_affinity_cpus() {
  std::vector<int> cpus;
  cpu_set_t mask;
  if (sched_getaffinity(0, sizeof(mask), &mask) != 0) return cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &mask)) cpus.push_back(c);
  return cpus;
}

// The process's CPUs: the mask the main thread had when the program started.
// A thread inherits its creator's mask, so once one team is pinned (one CPU
// per thread) a thread it creates, such as the engine's, sees a single CPU:
// pinning and thread counts must look at the process's mask instead.
//
// Where the user has OpenMP place the threads (OMP_PROC_BIND, OMP_PLACES,
// GOMP_CPU_AFFINITY), libgomp binds the main thread to its first place when
// it loads, before this runs, so the main thread's mask names one place's
// CPUs only: with OMP_PROC_BIND=true on a 2-vCPU VM every team had one
// thread (the 16-token LM head product took twice as long). The places
// together are the CPUs libgomp found in the mask the process started
// with: those count instead.
std::vector<int> process_cpus() {
  std::vector<int> cpus = thread_affinity_cpus(), placed;
  for (int p = 0; p < omp_get_num_places(); ++p) {
    std::vector<int> ids(size_t(std::max(0, omp_get_place_num_procs(p))));
    omp_get_place_proc_ids(p, ids.data());
    placed.insert(placed.end(), ids.begin(), ids.end());
  }
  std::sort(placed.begin(), placed.end());
  placed.erase(std::unique(placed.begin(), placed.end()), placed.end());
  return placed.size() > cpus.size() ? placed : cpus;
}
const std::vector<int> g_process_cpus = process_cpus();

std::vector<int> affinity_cpus() { return g_process_cpus.empty() ? thread_affinity_cpus() : g_process_cpus; }

int affinity_cpu_count() {
  const size_t cpus = affinity_cpus().size();
  if (cpus > 0) return int(cpus);
  return std::max(1u, std::thread::hardware_concurrency());
}

int default_threads() {
  if (const char* env = std::getenv("OMP_NUM_THREADS")) {
    const int n = std::atoi(env);  // "4" or the first entry of "4,2"
    if (n > 0) return n;
  }
  return usable_cpu_count();
}

std::atomic<int> g_threads{0};  // 0: not chosen yet

}  // namespace

double cgroup_cpu_limit(const std::string& root, const std::string& proc_self_cgroup) {
  double limit = std::numeric_limits<double>::infinity();
  for_each_cgroup_dir(
      root, proc_self_cgroup, "cpu", {"cpu", "cpu,cpuacct", "cpuacct,cpu"},
      [&](const std::string& dir, bool v2) { limit = std::min(limit, v2 ? read_v2_limit(dir) : read_v1_limit(dir)); });
  return limit;
}

int usable_cpu_count() {
  static const int count = [] {
    const int cpus = affinity_cpu_count();
    const double limit = cgroup_cpu_limit("/sys/fs/cgroup", read_proc_file("/proc/self/cgroup"));
    if (!(limit < double(cpus))) return cpus;  // no quota, or one above the CPU count
    // Rounded down: with 1.5 CPUs of quota a second spinning thread would
    // only get the process throttled.
    return std::max(1, int(std::floor(limit + 1e-9)));
  }();
  return count;
}

int compute_threads() {
  int n = g_threads.load(std::memory_order_relaxed);
  if (n > 0) return n;
  n = default_threads();
  g_threads.store(n, std::memory_order_relaxed);
  return n;
}

void set_compute_threads(int n) { g_threads.store(n > 0 ? n : default_threads(), std::memory_order_relaxed); }

std::string pinning_refusal() {
  for (const char* placed : {"OMP_PROC_BIND", "OMP_PLACES", "GOMP_CPU_AFFINITY"})
    if (std::getenv(placed)) return std::string("placed as ") + placed + " says";
  const int cpus = int(affinity_cpus().size());
  if (cpus == 0) return "not pinned: the affinity mask cannot be read";
  // A CPU quota narrower than the mask (docker --cpus without --cpuset-cpus)
  // means the CPUs are shared with other containers, which would pin to the
  // same first CPUs of the host: leave placement to the kernel there.
  if (usable_cpu_count() < cpus) return "not pinned: a CPU quota shares the affinity mask's CPUs";
  if (compute_threads() > cpus) return "not pinned: more threads than CPUs";
  return "";
}

bool pin_compute_threads() {
  if (!pinning_refusal().empty()) return false;
  const std::vector<int> cpus = affinity_cpus();
  const int threads = compute_threads();
  std::atomic<int> pinned{0};
#pragma omp parallel num_threads(threads)
  {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpus[size_t(omp_get_thread_num())], &one);
    if (pthread_setaffinity_np(pthread_self(), sizeof(one), &one) == 0) pinned.fetch_add(1);
  }
  return pinned.load() == threads;
}

bool release_thread_team() {
  if (omp_in_parallel()) return false;
  // GNU OpenMP frees only the calling thread's pool (its workers exit);
  // other threads' teams are untouched.
  return omp_pause_resource_all(omp_pause_hard) == 0;
}

}  // namespace dsv4

namespace dsv4 {

void parallel_for(int64_t n, const std::function<void(int64_t)>& body) {
#pragma omp parallel for schedule(dynamic, 1) num_threads(compute_threads())
  for (int64_t i = 0; i < n; ++i) body(i);
}

}  // namespace dsv4
