// The CUDA shim's costs as a CUDA program sees them (docs/perf.md, "shim"). An ordinary CUDA
// program: built by nvcc with -cudart shared, it runs natively on a GPU, or through hiberd with
// libhibercuda.so preloaded (scripts/shim-bench.sh runs it with batching on and off against
// hiberd --device=sim, whose kernels come from bench/shim_bench_kernels.cc).
//
//   shim_bench [--only=launch,throughput,bandwidth,sync] [--launches=N] [--burst=N]
//              [--sizes_mib=1,16,256] [--reps=N] [--warmup_mib=N] [--sync_iters=N]
//              [--label=TEXT]
//
// Measurements (each prints one line, see report()):
//   launch      the client-side cost of one launch (kernel<<<1, 1>>>), of the empty kernel and
//               of one with 3 parameters. Sustained: --launches launches back to back, the
//               loop alone timed (thread CPU time, process CPU time, wall time), the
//               cudaDeviceSynchronize that follows timed separately. Bursts: the same launches
//               in bursts of --burst from an idle device, each burst followed by an untimed
//               synchronisation; the median burst. Floor (baseline): an indirect call that
//               copies a launch's arguments (function, grid, block, stream, params) to memory.
//   throughput  launches per second from the first launch until cudaDeviceSynchronize returns,
//               for both kernels. The script's baseline is the same figure with batching off
//               (HIBER_BATCH=0).
//   bandwidth   cudaMemcpy H2D and D2H of --sizes_mib MiB from pageable (malloc) and pinned
//               (cudaMallocHost) memory; median of --reps copies, each timed alone, after
//               warm-up copies of at least --warmup_mib in all. Baseline: memcpy of the same
//               size between two host buffers in this process, in the same run.
//   sync        latency of one synchronous call on an idle device: cudaStreamQuery and
//               cudaStreamSynchronize (idle stream), cudaDeviceSynchronize, cudaEventQuery
//               (completed event), a 4-byte cudaMemcpy D2H to pageable and to pinned
//               memory; p50 and p99 over --sync_iters calls each timed alone. Baseline: an
//               8-byte round trip over a socketpair to a forked echo process (what a
//               socket RPC costs here).
//
// Output: one line per figure, fields separated by spaces:
//   RESULT label=L name=N value=V unit=U [p99=P] [baseline=BN:BV] [ratio=R]
// ratio = value / baseline value, in the units of the line (so for times lower is better and
// for bandwidths higher is better).
#include <cuda_runtime.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

// Kernels. Their host implementations for the simulated GPU are in shim_bench_kernels.cc, under
// these (mangled) names: keep the two in step.
__global__ void shim_bench_empty() {}                          // _Z16shim_bench_emptyv
__global__ void shim_bench_params(float* p, int n, float a) {  // _Z17shim_bench_paramsPfif
  // Never true for the arguments the benchmark passes (n = 0): the launch is as cheap as the
  // empty one on a GPU, only its parameters differ.
  if (static_cast<int>(threadIdx.x) < n) p[threadIdx.x] *= a;
}

namespace {

#define CHECK(call)                                                                       \
  do {                                                                                    \
    cudaError_t e_ = (call);                                                              \
    if (e_ != cudaSuccess) {                                                              \
      std::fprintf(stderr, "shim_bench: %s:%d: %s: %s (%d)\n", __FILE__, __LINE__, #call, \
                   cudaGetErrorString(e_), static_cast<int>(e_));                         \
      std::exit(1);                                                                       \
    }                                                                                     \
  } while (0)

std::string g_label = "run";

int64_t now_ns(clockid_t clock) {
  timespec t;
  clock_gettime(clock, &t);
  return int64_t{t.tv_sec} * 1000000000 + t.tv_nsec;
}
int64_t wall_ns() { return now_ns(CLOCK_MONOTONIC); }
int64_t thread_cpu_ns() { return now_ns(CLOCK_THREAD_CPUTIME_ID); }
int64_t process_cpu_ns() { return now_ns(CLOCK_PROCESS_CPUTIME_ID); }

// One figure: `p99` < 0 and an empty `baseline_name` leave those fields out.
void report(const std::string& name, double value, const char* unit, double p99 = -1,
            const std::string& baseline_name = "", double baseline = 0) {
  std::printf("RESULT label=%s name=%s value=%.4g unit=%s", g_label.c_str(), name.c_str(), value,
              unit);
  if (p99 >= 0) std::printf(" p99=%.4g", p99);
  if (!baseline_name.empty()) {
    std::printf(" baseline=%s:%.4g ratio=%.3g", baseline_name.c_str(), baseline,
                baseline != 0 ? value / baseline : 0.0);
  }
  std::printf("\n");
  std::fflush(stdout);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  size_t i = static_cast<size_t>(p * (v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

// ---- Launch cost ----

// The floor of a launch's client-side work: an indirect call (the program's call into the
// runtime) that copies what a launch carries into a record, as a batch would.
struct LaunchRecord {
  void* function;
  dim3 grid, block;
  size_t shared;
  cudaStream_t stream;
  unsigned char params[32];
  size_t param_bytes;
};
LaunchRecord g_records[64];
__attribute__((noinline)) void record_launch(const void* func, dim3 grid, dim3 block, void** args,
                                             size_t shared, cudaStream_t stream, int i) {
  LaunchRecord& r = g_records[i & 63];
  r.function = const_cast<void*>(func);
  r.grid = grid;
  r.block = block;
  r.shared = shared;
  r.stream = stream;
  // The three parameters of shim_bench_params: 8 + 4 + 4 bytes.
  std::memcpy(r.params, args[0], 8);
  std::memcpy(r.params + 8, args[1], 4);
  std::memcpy(r.params + 12, args[2], 4);
  r.param_bytes = 16;
}
using RecordFn = void (*)(const void*, dim3, dim3, void**, size_t, cudaStream_t, int);
RecordFn volatile g_record_fn = record_launch;

double floor_ns_per_launch(int n) {
  float* p = nullptr;
  int count = 0;
  float a = 1;
  void* args[] = {&p, &count, &a};
  const void* func = reinterpret_cast<const void*>(shim_bench_params);
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    const int64_t t0 = thread_cpu_ns();
    for (int i = 0; i < n; ++i) g_record_fn(func, dim3(1), dim3(1), args, 0, nullptr, i);
    best = std::min(best, double(thread_cpu_ns() - t0) / n);
  }
  return best;
}

// Launches of the empty kernel (or of shim_bench_params with `with_params`) on the legacy
// default stream, as kernel<<<1, 1>>>() does.
void launch_loop(int n, bool with_params) {
  float* p = nullptr;
  int count = 0;
  float a = 1;
  if (with_params) {
    for (int i = 0; i < n; ++i) shim_bench_params<<<1, 1>>>(p, count, a);
  } else {
    for (int i = 0; i < n; ++i) shim_bench_empty<<<1, 1>>>();
  }
}

void bench_launch(int n, int burst) {
  // Warm-up: the first launch loads the module and resolves the kernel.
  launch_loop(1000, false);
  launch_loop(1000, true);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());

  const double floor_us = floor_ns_per_launch(n) / 1000;
  report("launch_floor_cpu", floor_us, "us/launch");

  for (const bool with_params : {false, true}) {
    const std::string kernel = with_params ? "params3" : "empty";
    // Sustained: n launches back to back. Once the device falls behind, the launching thread
    // also waits for room to send (back-pressure), which the times below include.
    const int64_t w0 = wall_ns(), t0 = thread_cpu_ns(), p0 = process_cpu_ns();
    launch_loop(n, with_params);
    const int64_t w1 = wall_ns(), t1 = thread_cpu_ns(), p1 = process_cpu_ns();
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    const int64_t w2 = wall_ns();
    report("launch_cpu_" + kernel, double(t1 - t0) / n / 1000, "us/launch", -1, "floor", floor_us);
    report("launch_process_cpu_" + kernel, double(p1 - p0) / n / 1000, "us/launch");
    report("launch_wall_" + kernel, double(w1 - w0) / n / 1000, "us/launch");
    report("launch_then_sync_" + kernel, double(w2 - w1) / 1000, "us");

    // Bursts: `burst` launches from an idle device, then a synchronisation (not timed); the
    // median burst. Nothing waits for the device inside a burst small enough for the queue.
    std::vector<double> cpu, process, wall;
    for (int done = 0; done < n; done += burst) {
      const int64_t bw0 = wall_ns(), bt0 = thread_cpu_ns(), bp0 = process_cpu_ns();
      launch_loop(burst, with_params);
      const int64_t bw1 = wall_ns(), bt1 = thread_cpu_ns(), bp1 = process_cpu_ns();
      CHECK(cudaDeviceSynchronize());
      cpu.push_back(double(bt1 - bt0) / burst / 1000);
      process.push_back(double(bp1 - bp0) / burst / 1000);
      wall.push_back(double(bw1 - bw0) / burst / 1000);
    }
    report("launch_burst_cpu_" + kernel, median(cpu), "us/launch", -1, "floor", floor_us);
    report("launch_burst_process_cpu_" + kernel, median(process), "us/launch");
    report("launch_burst_wall_" + kernel, median(wall), "us/launch");
  }
}

// ---- Throughput ----

void bench_throughput(int n) {
  for (const bool with_params : {false, true}) {
    launch_loop(100, with_params);
    CHECK(cudaDeviceSynchronize());
    const int64_t w0 = wall_ns();
    launch_loop(n, with_params);
    CHECK(cudaDeviceSynchronize());
    const int64_t w1 = wall_ns();
    CHECK(cudaGetLastError());
    report(std::string("throughput_") + (with_params ? "params3" : "empty"),
           n / (double(w1 - w0) / 1e9), "launches/s");
  }
}

// ---- Bandwidth ----

// Touches every page, so no copy pays first-touch page faults.
void prefault(void* p, size_t bytes) { std::memset(p, 1, bytes); }

void bench_bandwidth(const std::vector<size_t>& sizes_mib, int reps, size_t warmup_mib) {
  for (const size_t mib : sizes_mib) {
    const size_t bytes = mib << 20;
    const double gib = double(bytes) / (1 << 30);
    char* pageable = static_cast<char*>(std::malloc(bytes));
    char* host2 = static_cast<char*>(std::malloc(bytes));
    char* pinned = nullptr;
    char* device = nullptr;
    if (!pageable || !host2) {
      std::fprintf(stderr, "shim_bench: out of host memory\n");
      std::exit(1);
    }
    CHECK(cudaMallocHost(&pinned, bytes));
    CHECK(cudaMalloc(&device, bytes));
    prefault(pageable, bytes);
    prefault(host2, bytes);
    prefault(pinned, bytes);
    CHECK(cudaMemset(device, 0, bytes));
    CHECK(cudaDeviceSynchronize());

    // Each copy timed alone (wall clock, the copy is synchronous), after warm-up copies of at
    // least --warmup_mib in all (under the shim, pageable copies go through a staging FIFO in
    // hiberd's arena, whose pages cost faults on both sides until the FIFO has wrapped once).
    const size_t warmups = std::max<size_t>(1, (warmup_mib + mib - 1) / mib);
    auto time_gibs = [&](auto&& copy) {
      for (size_t w = 0; w < warmups; ++w) copy();
      std::vector<double> v;
      for (int r = 0; r < reps; ++r) {
        const int64_t t0 = wall_ns();
        copy();
        v.push_back(gib / (double(wall_ns() - t0) / 1e9));
      }
      return median(v);
    };
    const double base = time_gibs([&] { std::memcpy(host2, pageable, bytes); });
    const std::string suffix = "_" + std::to_string(mib) + "MiB";
    report("memcpy" + suffix, base, "GiB/s");
    struct Case {
      const char* name;
      void* dst;
      const void* src;
      cudaMemcpyKind kind;
    };
    const Case cases[] = {
        {"h2d_pageable", device, pageable, cudaMemcpyHostToDevice},
        {"h2d_pinned", device, pinned, cudaMemcpyHostToDevice},
        {"d2h_pageable", pageable, device, cudaMemcpyDeviceToHost},
        {"d2h_pinned", pinned, device, cudaMemcpyDeviceToHost},
    };
    for (const Case& c : cases) {
      const double v = time_gibs([&] { CHECK(cudaMemcpy(c.dst, c.src, bytes, c.kind)); });
      report(c.name + suffix, v, "GiB/s", -1, "memcpy", base);
    }
    CHECK(cudaFree(device));
    CHECK(cudaFreeHost(pinned));
    std::free(pageable);
    std::free(host2);
  }
}

// ---- Synchronous calls ----

// A forked process that echoes 8 bytes at a time; `fd` is our end.
struct Echo {
  int fd = -1;
  pid_t pid = -1;
};

Echo start_echo() {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    std::perror("shim_bench: socketpair");
    std::exit(1);
  }
  const pid_t pid = fork();
  if (pid == 0) {
    close(sv[0]);
    char b[8];
    for (;;) {
      size_t got = 0;
      while (got < 8) {
        const ssize_t r = read(sv[1], b + got, 8 - got);
        if (r <= 0) _exit(0);
        got += r;
      }
      if (write(sv[1], b, 8) != 8) _exit(0);
    }
  }
  close(sv[1]);
  return {sv[0], pid};
}

void echo_round_trip(int fd) {
  char b[8] = {};
  if (write(fd, b, 8) != 8) std::exit(1);
  size_t got = 0;
  while (got < 8) {
    const ssize_t r = read(fd, b + got, 8 - got);
    if (r <= 0) std::exit(1);
    got += r;
  }
}

template <typename F>
std::vector<double> time_each_us(int iters, F&& f) {
  for (int i = 0; i < std::min(iters / 10 + 1, 1000); ++i) f();
  std::vector<double> v;
  v.reserve(iters);
  for (int i = 0; i < iters; ++i) {
    const int64_t t0 = wall_ns();
    f();
    v.push_back(double(wall_ns() - t0) / 1000);
  }
  return v;
}

void bench_sync(int iters, const Echo& echo) {
  const std::vector<double> base = time_each_us(iters, [&] { echo_round_trip(echo.fd); });
  const double base_p50 = median(base);
  report("socket_round_trip", base_p50, "us", percentile(base, 0.99));

  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaEvent_t event;
  CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  CHECK(cudaEventRecord(event, stream));
  CHECK(cudaEventSynchronize(event));
  int* device = nullptr;
  CHECK(cudaMalloc(&device, 4));
  CHECK(cudaMemset(device, 0, 4));
  int* pinned = nullptr;
  CHECK(cudaMallocHost(&pinned, 4));
  int pageable = 0;
  CHECK(cudaDeviceSynchronize());

  auto run = [&](const char* name, auto&& call) {
    const std::vector<double> v = time_each_us(iters, call);
    report(name, median(v), "us", percentile(v, 0.99), "socket_round_trip", base_p50);
  };
  run("sync_stream_query_idle", [&] { CHECK(cudaStreamQuery(stream)); });
  run("sync_stream_synchronize_idle", [&] { CHECK(cudaStreamSynchronize(stream)); });
  run("sync_device_synchronize_idle", [&] { CHECK(cudaDeviceSynchronize()); });
  run("sync_event_query_done", [&] { CHECK(cudaEventQuery(event)); });
  run("sync_memcpy_d2h_4B_pageable",
      [&] { CHECK(cudaMemcpy(&pageable, device, 4, cudaMemcpyDeviceToHost)); });
  run("sync_memcpy_d2h_4B_pinned",
      [&] { CHECK(cudaMemcpy(pinned, device, 4, cudaMemcpyDeviceToHost)); });

  CHECK(cudaFreeHost(pinned));
  CHECK(cudaFree(device));
  CHECK(cudaEventDestroy(event));
  CHECK(cudaStreamDestroy(stream));
}

bool has(const std::string& list, const char* what) {
  if (list.empty()) return true;
  std::string padded = "," + list + ",";
  return padded.find("," + std::string(what) + ",") != std::string::npos;
}

}  // namespace

int main(int argc, char** argv) {
  std::string only;
  int launches = 100000;
  int burst = 2000;
  int reps = 7;
  size_t warmup_mib = 64;
  int sync_iters = 20000;
  std::vector<size_t> sizes_mib = {1, 16, 256};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* flag) -> const char* {
      const size_t n = std::strlen(flag);
      return a.compare(0, n, flag) == 0 ? a.c_str() + n : nullptr;
    };
    if (const char* v = value("--only=")) {
      only = v;
    } else if (const char* v = value("--launches=")) {
      launches = std::atoi(v);
    } else if (const char* v = value("--burst=")) {
      burst = std::atoi(v);
    } else if (const char* v = value("--reps=")) {
      reps = std::atoi(v);
    } else if (const char* v = value("--warmup_mib=")) {
      warmup_mib = std::strtoull(v, nullptr, 10);
    } else if (const char* v = value("--sync_iters=")) {
      sync_iters = std::atoi(v);
    } else if (const char* v = value("--label=")) {
      g_label = v;
    } else if (const char* v = value("--sizes_mib=")) {
      sizes_mib.clear();
      for (const char* p = v; *p;) {
        char* end = nullptr;
        sizes_mib.push_back(std::strtoull(p, &end, 10));
        p = *end == ',' ? end + 1 : end;
        if (end == p && *p) break;
      }
    } else {
      std::fprintf(stderr,
                   "usage: %s [--only=launch,throughput,bandwidth,sync] [--launches=N] "
                   "[--burst=N] [--sizes_mib=1,16,256] [--reps=N] [--warmup_mib=N] "
                   "[--sync_iters=N] [--label=TEXT]\n",
                   argv[0]);
      return 2;
    }
  }
  if (launches <= 0 || burst <= 0 || reps <= 0 || sync_iters <= 0) {
    std::fprintf(stderr, "shim_bench: counts must be positive\n");
    return 2;
  }

  // The echo process is forked before the first CUDA call, as a CUDA process may not fork
  // and use CUDA in the child.
  Echo echo;
  if (has(only, "sync")) echo = start_echo();

  CHECK(cudaSetDevice(0));
  CHECK(cudaFree(nullptr));  // opens the session / creates the context
  if (has(only, "launch")) bench_launch(launches, burst);
  if (has(only, "throughput")) bench_throughput(launches);
  if (has(only, "bandwidth")) bench_bandwidth(sizes_mib, reps, warmup_mib);
  if (has(only, "sync")) bench_sync(sync_iters, echo);

  if (echo.fd >= 0) {
    close(echo.fd);
    waitpid(echo.pid, nullptr, 0);
  }
  return 0;
}
