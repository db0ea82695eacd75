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
#include <functional>
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

// Pins the calling thread's OpenMP team of compute_threads(): thread i to
// the i-th CPU of the affinity mask (distinct cores first on the usual x86
// numbering, where SMT siblings come after all cores), so that the threads
// keep their caches and the kernel does not move two of them onto one core.
// Later teams of that size or smaller reuse the same threads in the same
// order. Does nothing and returns false when the user already placed the
// threads (OMP_PROC_BIND, OMP_PLACES or GOMP_CPU_AFFINITY is set;
// OMP_PROC_BIND=false turns pinning off), when a cgroup CPU quota leaves
// fewer CPUs than the mask names (other containers share them), or when
// there are more threads than CPUs. Call it on the thread that will run
// the model. On this project's 2-vCPU VM pinned and unpinned runs were
// within the noise (prefill 8.3-8.5 against 8.6-9.1 s, batch-1 decode
// 62-77 against 59-72 ms); it is for hosts with SMT siblings and sockets,
// where the kernel may put two compute threads on one core.
bool pin_compute_threads();
// Why pin_compute_threads() leaves the threads where they are; empty when
// it pins them.
std::string pinning_refusal();

// Ends the calling thread's OpenMP team: its worker threads exit, and the
// thread's next parallel region starts a new team. A thread that is done
// with compute calls it before another thread takes over the model (the
// engine's constructor does, for the thread that loaded the model): GNU
// OpenMP counts every team's workers, idle ones included, and once the
// process holds more of them than it has CPUs, a worker waiting for the
// next region spins 100 times instead of 300,000 and then sleeps, so
// each of a decode step's several hundred regions has to wake its workers
// through the kernel (docs/engine.md, "The engine's OpenMP team"). Returns
// false inside a parallel region (then nothing changes).
bool release_thread_team();

// Loops with less work than this (multiply-adds or comparable element
// operations) stay on the calling thread. A fork/join costs a few
// microseconds while OpenMP threads spin and 30-100 us once they sleep
// (OMP_WAIT_POLICY=passive, more threads than CPUs, a busy machine); 2^20
// fp32 multiply-adds take 20-50 us of one core in the matrix kernels, more
// in the element-wise loops, so a fork costs at most about what it saves.
constexpr int64_t kMinParallelWork = int64_t(1) << 20;

inline int threads_for(int64_t work) { return work >= kMinParallelWork ? compute_threads() : 1; }

}  // namespace dsv4

namespace dsv4 {

// Runs body(i) for every i in [0, n) on the compute threads, which claim the
// items one at a time (for coarse, uneven items outside the kernels, e.g.
// writing a synthetic checkpoint; the kernels schedule their own loops).
void parallel_for(int64_t n, const std::function<void(int64_t)>& body);

}  // namespace dsv4
