// How many threads the compute loops use, and when a loop is worth forking.
//
// Every OpenMP region in the library names its team size, through
// threads_for(work) or compute_threads(), instead of relying on the OpenMP
// default, for two reasons:
//  - the default is the number of CPUs in the affinity mask, which in a
//    container with a CPU quota (docker --cpus=2 on a 64-core host) is far
//    more than the CPUs we may use; 64 spinning threads on 2 CPUs of quota
//    turn every fork/join into milliseconds;
//  - omp_set_num_threads() only changes the calling thread's setting, and the
//    engine runs the model on its own thread, so `--threads` has to be a
//    process-wide value.
// The team size never changes results: every reduction in the model has a
// fixed order per output element.
#pragma once
#include <cstdint>
#include <string>

namespace dsv4 {

// CPUs this process may run on: the affinity mask, capped by the cgroup CPU
// quota (cgroup v2 cpu.max or v1 cpu.cfs_quota_us), rounded down (at least 1).
int usable_cpu_count();

// The tightest CPU quota (in CPUs; infinity when none) that the cgroup
// hierarchy mounted under `cgroup_root` puts on the cgroups listed in
// `proc_self_cgroup` (the text of /proc/self/cgroup). Exposed for tests.
double cgroup_cpu_limit(const std::string& cgroup_root, const std::string& proc_self_cgroup);

// The process-wide team size: set_compute_threads(n) with n > 0, else
// OMP_NUM_THREADS when set, else usable_cpu_count().
int compute_threads();
void set_compute_threads(int n);

// Loops with less work than this (multiply-adds or comparable element
// operations) stay on the calling thread. A fork/join costs a few
// microseconds while OpenMP threads spin and 30-100 us once they sleep
// (OMP_WAIT_POLICY=passive, more threads than CPUs, a busy machine); 2^20
// fp32 multiply-adds take 20-50 us of one core in the matrix kernels, more
// in the element-wise loops, so a fork costs at most about what it saves.
constexpr int64_t kMinParallelWork = int64_t(1) << 20;

inline int threads_for(int64_t work) { return work >= kMinParallelWork ? compute_threads() : 1; }

}  // namespace dsv4
