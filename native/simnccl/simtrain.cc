/*
 * c4d-simtrain: a training loop that talks to NCCL and the CUDA runtime the way
 * libtorch_cuda does (only the NCCL API, the CUDA runtime subset and sim_ext.h), so
 * the c4d shim sees what it would see in a real job.
 *
 *   c4d-simtrain --steps S --tp T --pp P --job-dir DIR [--compute-us U]
 *                [--tp-bytes B] [--dp-bytes B] [--pp-bytes B] [--progress] [--nonblocking]
 *   c4d-simtrain --job-dir DIR --verify     every collective, results checked exactly
 *   c4d-simtrain --bench N [--bench-threads T] [--bench-group G]
 *                                           T threads on T comms, N x ncclAllReduce(count=0)
 *                                           each (G per ncclGroupStart/End), host ns per call;
 *                                           --bench-events: + the shim's 2 event records per call
 *   c4d-simtrain --bench-cuda N             cudaEventRecord/Query host cost
 *
 * Env: RANK, WORLD_SIZE, LOCAL_RANK; SIMNCCL_FAULTS (crash / noncomm-* / mismatch of this
 * rank are applied here; comm-* by simnccl), SIMNCCL_JITTER and SIMNCCL_SEED (compute jitter).
 * A mismatch fault at step S: the rank leaves out its TP reduce-scatter (its DP all-reduce
 * when tp = 1) and every rank joins a world all-reduce at the end of step S (what=skip, the
 * default). With what=op|count|dtype|root every rank joins one more world collective at the end
 * of step S, which the faulty rank calls differently (world_probe below).
 *
 * Layout (Megatron order, tp fastest, then dp, then pp):
 *   rank = pp_idx * (dp * tp) + dp_idx * tp + tp_idx,   dp = WORLD_SIZE / (tp * pp)
 * TP groups are tp consecutive ranks; a PP group links the ranks with equal
 * (dp_idx, tp_idx), its comm rank = pp stage; a DP group those with equal (pp_idx, tp_idx).
 *
 * One step: [recv activations from the previous stage] → forward compute (U/3) →
 * TP all-gather → group{send activations to the next stage, recv its gradients} →
 * backward compute (2U/3) → TP reduce-scatter → [send gradients to the previous
 * stage] → DP all-reduce → cudaStreamSynchronize.
 *
 * --nonblocking: communicators made with ncclConfig_t.blocking = 0 (PyTorch 2.6-2.7 when a
 * device_id is bound, TORCH_NCCL_USE_COMM_NONBLOCKING=1 later). A call may return
 * ncclInProgress; the driver then polls ncclCommGetAsyncError until the comm settles, as
 * PyTorch's C10D_NCCL_CHECK_TIMEOUT does, and prints ncclGetLastError at the end.
 */
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include "c4d/cuda_abi.h"
#include "c4d/nccl_abi.h"
#include "fault_spec.h"
#include "simnccl/sim_ext.h"

extern "C" {
cudaError_t cudaSetDevice(int);
cudaError_t cudaGetDeviceCount(int*);
cudaError_t cudaStreamCreate(cudaStream_t*);
cudaError_t cudaStreamDestroy(cudaStream_t);
cudaError_t cudaStreamSynchronize(cudaStream_t);
cudaError_t cudaMalloc(void**, size_t);
cudaError_t cudaFree(void*);
cudaError_t cudaMemcpy(void*, const void*, size_t, int);
cudaError_t cudaMemset(void*, int, size_t);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t*, unsigned int);
cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t);
cudaError_t cudaEventQuery(cudaEvent_t);
cudaError_t cudaEventDestroy(cudaEvent_t);
const char* cudaGetErrorString(cudaError_t);
}

namespace {

int g_rank = 0;

[[noreturn]] void die(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void die(const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  fprintf(stderr, "c4d-simtrain: rank %d: %s\n", g_rank, buf);
  exit(1);
}

#define NCCL_OK(call)                                                                      \
  do {                                                                                     \
    ncclResult_t r_ = (call);                                                              \
    if (r_ != ncclSuccess) die("%s failed: %s (%d)", #call, ncclGetErrorString(r_), int(r_)); \
  } while (0)
#define CUDA_OK(call)                                                                      \
  do {                                                                                     \
    cudaError_t e_ = (call);                                                               \
    if (e_ != 0) die("%s failed: %s (%d)", #call, cudaGetErrorString(e_), int(e_));       \
  } while (0)

bool g_nonblocking = false;

/* A call on a nonblocking comm may return ncclInProgress: poll until the comm settles. */
void settle(ncclResult_t r, ncclComm_t comm, const char* what) {
  while (r == ncclInProgress) {
    ncclResult_t ae = ncclSuccess;
    ncclResult_t q = ncclCommGetAsyncError(comm, &ae);
    if (q != ncclSuccess) die("ncclCommGetAsyncError after %s failed: %s (%d)", what, ncclGetErrorString(q), int(q));
    r = ae;
    if (r == ncclInProgress) {
      timespec ts{0, 20000};
      nanosleep(&ts, nullptr);
    }
  }
  if (r != ncclSuccess) die("%s failed: %s (%d)", what, ncclGetErrorString(r), int(r));
}
#define NB_OK(call, comm)        \
  do {                           \
    ncclResult_t r_ = (call);    \
    settle(r_, (comm), #call);   \
  } while (0)

uint64_t mono_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

struct Args {
  long steps = 10, tp = 1, pp = 1, compute_us = 2000;
  long tp_bytes = 256 << 10, dp_bytes = 1 << 20, pp_bytes = 128 << 10;
  long bench = 0, bench_cuda = 0, bench_threads = 1, bench_group = 1, init_timeout_s = 120;
  bool verify = false, progress = false, nonblocking = false, bench_events = false;
  std::string job_dir;
};

const char* kUsage =
    "usage: c4d-simtrain --steps S --tp T --pp P --job-dir DIR [--compute-us U] [--tp-bytes B]\n"
    "                    [--dp-bytes B] [--pp-bytes B] [--progress] [--init-timeout S] [--nonblocking]\n"
    "       c4d-simtrain --job-dir DIR --verify\n"
    "       c4d-simtrain --bench N [--bench-threads T] [--bench-group G] [--bench-events] | --bench-cuda N\n";

[[noreturn]] void usage_error(const char* fmt, const char* a) {
  fprintf(stderr, "c4d-simtrain: ");
  fprintf(stderr, fmt, a);
  fprintf(stderr, "\n%s", kUsage);
  exit(2);
}

long parse_long(const char* flag, const char* v, long lo, long hi) {
  if (!v) usage_error("%s needs a value", flag);
  char* end = nullptr;
  errno = 0;
  long x = strtol(v, &end, 10);
  if (errno || end == v || *end || x < lo || x > hi) {
    char msg[160];
    snprintf(msg, sizeof msg, "%s=%s is not an integer in [%ld, %ld]", flag, v, lo, hi);
    usage_error("%s", msg);
  }
  return x;
}

Args parse_args(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const char* f = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : nullptr;
    auto num = [&](long lo, long hi) {
      ++i;
      return parse_long(f, v, lo, hi);
    };
    if (!strcmp(f, "--steps")) a.steps = num(0, 1L << 40);
    else if (!strcmp(f, "--tp")) a.tp = num(1, 1 << 16);
    else if (!strcmp(f, "--pp")) a.pp = num(1, 1 << 16);
    else if (!strcmp(f, "--compute-us")) a.compute_us = num(0, 1L << 40);
    else if (!strcmp(f, "--tp-bytes")) a.tp_bytes = num(4, 1L << 32);
    else if (!strcmp(f, "--dp-bytes")) a.dp_bytes = num(4, 1L << 32);
    else if (!strcmp(f, "--pp-bytes")) a.pp_bytes = num(4, 1L << 32);
    else if (!strcmp(f, "--bench")) a.bench = num(1, 1L << 40);
    else if (!strcmp(f, "--bench-cuda")) a.bench_cuda = num(1, 1L << 30);
    else if (!strcmp(f, "--bench-threads")) a.bench_threads = num(1, 256);
    else if (!strcmp(f, "--bench-group")) a.bench_group = num(1, 4096);
    else if (!strcmp(f, "--init-timeout")) a.init_timeout_s = num(1, 1L << 30);
    else if (!strcmp(f, "--job-dir")) {
      if (!v) usage_error("%s needs a value", f);
      a.job_dir = v;
      ++i;
    } else if (!strcmp(f, "--verify")) a.verify = true;
    else if (!strcmp(f, "--progress")) a.progress = true;
    else if (!strcmp(f, "--nonblocking")) a.nonblocking = true;
    else if (!strcmp(f, "--bench-events")) a.bench_events = true;
    else if (!strcmp(f, "-h") || !strcmp(f, "--help")) {
      fputs(kUsage, stdout);
      exit(0);
    } else usage_error("unknown argument '%s'", f);
  }
  if (!a.bench && !a.bench_cuda && a.job_dir.empty()) usage_error("%s is required", "--job-dir");
  return a;
}

long env_int(const char* name, long def, bool required) {
  const char* s = getenv(name);
  if (!s || !*s) {
    if (required) die("%s is not set (the launcher sets RANK, WORLD_SIZE, LOCAL_RANK)", name);
    return def;
  }
  char* end = nullptr;
  long v = strtol(s, &end, 10);
  if (*end || v < 0 || v > (1L << 24)) die("%s=%s is not a non-negative integer", name, s);
  return v;
}

/* ---- bootstrap: rank 0 publishes the unique id in DIR/nccl.id ---- */

/* File = "<SIMNCCL_JOB or ->\n" + 128 id bytes. The job line lets a rank ignore a
 * stale file a previous run left in a reused job dir. */
std::string job_tag() {
  const char* j = getenv("SIMNCCL_JOB");
  return std::string(j && *j ? j : "-") + "\n";
}

void publish_id(const std::string& dir, const ncclUniqueId& id) {
  std::string path = dir + "/nccl.id", tmp = dir + "/.nccl.id." + std::to_string(getpid()) + ".tmp";
  std::string body = job_tag() + std::string(id.internal, NCCL_UNIQUE_ID_BYTES);
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) die("cannot create %s: %s", tmp.c_str(), strerror(errno));
  if (write(fd, body.data(), body.size()) != ssize_t(body.size())) die("cannot write %s: %s", tmp.c_str(), strerror(errno));
  close(fd);
  if (rename(tmp.c_str(), path.c_str()) != 0) die("cannot rename %s to %s: %s", tmp.c_str(), path.c_str(), strerror(errno));
}

ncclUniqueId wait_id(const std::string& dir, long timeout_s) {
  std::string path = dir + "/nccl.id", tag = job_tag();
  uint64_t deadline = mono_ns() + uint64_t(timeout_s) * 1000000000ull;
  for (;;) {
    FILE* f = fopen(path.c_str(), "rb");
    if (f) {
      char buf[512];
      size_t n = fread(buf, 1, sizeof buf, f);
      fclose(f);
      if (n == tag.size() + NCCL_UNIQUE_ID_BYTES && memcmp(buf, tag.data(), tag.size()) == 0) {
        ncclUniqueId id;
        memcpy(id.internal, buf + tag.size(), NCCL_UNIQUE_ID_BYTES);
        return id;
      }
    }
    if (mono_ns() > deadline)
      die("no valid %s after %ld s (is rank 0 running with the same --job-dir and SIMNCCL_JOB?)", path.c_str(),
          timeout_s);
    usleep(10000);
  }
}

/* ---- --bench ---- */

uint64_t thread_cpu_ns() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

/* One bench thread: its own 1-rank communicator and stream, `n` ncclAllReduce(count=0)
 * calls, `group` at a time inside ncclGroupStart/End when group > 1. Wall time and the
 * thread's own CPU time: the latter does not count time other processes took the core. */
struct BenchThread {
  long n = 0, group = 1;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  uint64_t wall_ns = 0, cpu_ns = 0;
  pthread_t tid{};
  std::vector<cudaEvent_t> events;  // --bench-events: the records the shim would make, made here
  size_t next_event = 0;

  void record() {
    CUDA_OK(cudaEventRecord(events[next_event], stream));
    next_event = (next_event + 1) % events.size();
  }
  void calls(long count) {
    const bool ev = !events.empty();
    for (long i = 0; i < count; i += group) {
      if (group > 1) NCCL_OK(ncclGroupStart());
      if (ev && group > 1) record();  // a group: one pair of events for the stream
      for (long j = 0; j < group; ++j) {
        if (ev && group == 1) record();
        NCCL_OK(ncclAllReduce(nullptr, nullptr, 0, ncclFloat32, ncclSum, comm, stream));
        if (ev && group == 1) record();
      }
      if (group > 1) NCCL_OK(ncclGroupEnd());
      if (ev && group > 1) record();
    }
  }
  static void* main(void* self) {
    auto* t = static_cast<BenchThread*>(self);
    // Warm-up to the steady state, as many calls as measured: lookups done, and the shim's op
    // slots and events in circulation (its agent hands them back every few ms), their pages
    // touched before (a slot's first use costs a page fault, once in a process's life).
    t->calls(t->n);
    uint64_t c0 = thread_cpu_ns(), w0 = mono_ns();
    t->calls(t->n);
    t->wall_ns = mono_ns() - w0;
    t->cpu_ns = thread_cpu_ns() - c0;
    CUDA_OK(cudaStreamSynchronize(t->stream));
    return nullptr;
  }
};

/* --bench N [--bench-threads T] [--bench-group G] [--bench-events]: T threads, each on its own
 * communicator, N calls each. Prints ns per call: wall (mean over threads) and the threads' own
 * CPU. --bench-events records two events per call (per group) from a pool of 65536 per thread,
 * as the shim does: a run without the shim that pays what the shim's event records cost. */
int run_bench(long n, long threads, long group, bool events) {
  n = (n + group - 1) / group * group;
  std::vector<BenchThread> ts(static_cast<size_t>(threads));
  for (BenchThread& t : ts) {  // comms made one after the other: a 1-rank init does not wait
    ncclUniqueId id;
    NCCL_OK(ncclGetUniqueId(&id));
    NCCL_OK(ncclCommInitRank(&t.comm, 1, id, 0));
    CUDA_OK(cudaStreamCreate(&t.stream));
    t.n = n;
    t.group = group;
    if (events) {
      t.events.resize(65536);
      for (cudaEvent_t& e : t.events) CUDA_OK(cudaEventCreateWithFlags(&e, 0));
    }
  }
  for (BenchThread& t : ts)
    if (pthread_create(&t.tid, nullptr, &BenchThread::main, &t) != 0) die("pthread_create failed");
  double wall = 0, cpu = 0;
  for (BenchThread& t : ts) {
    pthread_join(t.tid, nullptr);
    wall += double(t.wall_ns) / double(n);
    cpu += double(t.cpu_ns) / double(n);
  }
  printf("bench ns_per_call=%.2f cpu_ns_per_call=%.2f threads=%ld group=%ld\n", wall / double(threads),
         cpu / double(threads), threads, group);
  for (BenchThread& t : ts) {
    for (cudaEvent_t e : t.events) CUDA_OK(cudaEventDestroy(e));
    NCCL_OK(ncclCommDestroy(t.comm));
    CUDA_OK(cudaStreamDestroy(t.stream));
  }
  return 0;
}

int run_bench_cuda(long n) {
  cudaStream_t s;
  CUDA_OK(cudaStreamCreate(&s));
  cudaEvent_t e;
  CUDA_OK(cudaEventCreateWithFlags(&e, 0));
  uint64_t t0 = mono_ns();
  uint64_t c0 = thread_cpu_ns();
  for (long i = 0; i < n; ++i) CUDA_OK(cudaEventRecord(e, s)); /* idle stream: fast path */
  uint64_t t1 = mono_ns(), c1 = thread_cpu_ns();
  for (long i = 0; i < n; ++i) (void)cudaEventQuery(e);
  uint64_t t2 = mono_ns();
  CUDA_OK(simLaunchCompute(s, 200000000ull)); /* keep the stream busy: records queue up */
  uint64_t t3 = mono_ns();
  for (long i = 0; i < n; ++i) CUDA_OK(cudaEventRecord(e, s));
  uint64_t t4 = mono_ns();
  CUDA_OK(cudaStreamSynchronize(s));
  /* Records as the shim makes them: a different event each time, from a pool (cold lines). */
  const long kPool = 65536;
  std::vector<cudaEvent_t> pool(static_cast<size_t>(kPool));
  for (cudaEvent_t& x : pool) CUDA_OK(cudaEventCreateWithFlags(&x, 0));
  for (long i = 0; i < n; ++i) CUDA_OK(cudaEventRecord(pool[static_cast<size_t>(i % kPool)], s));  // warm-up
  uint64_t c5 = thread_cpu_ns();
  for (long i = 0; i < n; ++i) CUDA_OK(cudaEventRecord(pool[static_cast<size_t>((i * 7919) % kPool)], s));
  uint64_t c6 = thread_cpu_ns();
  printf("bench event_record_idle_ns=%.2f event_query_ns=%.2f event_record_busy_ns=%.2f event_record_idle_cpu_ns=%.2f "
         "event_record_pool_cpu_ns=%.2f\n",
         double(t1 - t0) / double(n), double(t2 - t1) / double(n), double(t4 - t3) / double(n),
         double(c1 - c0) / double(n), double(c6 - c5) / double(n));
  for (cudaEvent_t x : pool) CUDA_OK(cudaEventDestroy(x));
  CUDA_OK(cudaEventDestroy(e));
  CUDA_OK(cudaStreamDestroy(s));
  return 0;
}

/* ---- --verify ---- */

struct Verifier {
  ncclComm_t comm;
  cudaStream_t s;
  int n, r;

  template <class T>
  T* dev(size_t count) {
    void* p = nullptr;
    CUDA_OK(cudaMalloc(&p, count * sizeof(T) + 1));
    return static_cast<T*>(p);
  }
  void sync() {
    CUDA_OK(cudaStreamSynchronize(s));
    ncclResult_t ae;
    NCCL_OK(ncclCommGetAsyncError(comm, &ae));
    if (ae != ncclSuccess) die("async error after a verified op: %s", ncclGetErrorString(ae));
  }
  template <class T>
  void check(const char* what, const T* got, const std::vector<T>& want) {
    for (size_t i = 0; i < want.size(); ++i)
      if (memcmp(&got[i], &want[i], sizeof(T)) != 0) {
        printf("verify FAILED: %s: rank %d index %zu: got %.17g expected %.17g\n", what, r, i, double(got[i]),
               double(want[i]));
        fflush(stdout);
        exit(1);
      }
  }
};

template <class T>
T redop_apply(int op, T a, T b) {
  switch (op) {
    case ncclSum: case ncclAvg: return T(a + b);
    case ncclProd: return T(a * b);
    case ncclMax: return a < b ? b : a;
    default: return b < a ? b : a;
  }
}

template <class T>
void verify_allreduce(Verifier& v, ncclDataType_t dt, const char* tname, size_t count) {
  static const char* opnames[] = {"sum", "prod", "max", "min", "avg"};
  for (int op = 0; op < ncclNumOps; ++op) {
    auto val = [&](int rank, size_t i) {
      return op == ncclProd ? T(1 + (rank + int(i)) % 3) : T((rank + 1) * 2 + int(i % 5));
    };
    T* in = v.dev<T>(count);
    T* out = v.dev<T>(count);
    for (size_t i = 0; i < count; ++i) in[i] = val(v.r, i);
    NCCL_OK(ncclAllReduce(in, out, count, dt, ncclRedOp_t(op), v.comm, v.s));
    v.sync();
    std::vector<T> want(count);
    for (size_t i = 0; i < count; ++i) {
      T acc = val(0, i);
      for (int q = 1; q < v.n; ++q) acc = redop_apply(op, acc, val(q, i));
      want[i] = op == ncclAvg ? T(acc / T(v.n)) : acc;
    }
    char what[64];
    snprintf(what, sizeof what, "AllReduce(%s,%s)", tname, opnames[op]);
    v.check(what, out, want);
    CUDA_OK(cudaFree(in));
    CUDA_OK(cudaFree(out));
  }
}

/* 16-bit floats: small integers are exact, so the check compares float values. */
void verify_allreduce16(Verifier& v, ncclDataType_t dt, const char* tname) {
  const size_t count = 777;
  auto enc = [&](float f) -> uint16_t {
    uint32_t b;
    memcpy(&b, &f, 4);
    if (dt == ncclBfloat16) return uint16_t(b >> 16);
    int e = int((b >> 23) & 0xff) - 127 + 15; /* exact small integers only */
    return f == 0 ? 0 : uint16_t(((b >> 16) & 0x8000u) | (uint32_t(e) << 10) | ((b >> 13) & 0x3ffu));
  };
  uint16_t* in = v.dev<uint16_t>(count);
  uint16_t* out = v.dev<uint16_t>(count);
  for (size_t i = 0; i < count; ++i) in[i] = enc(float(v.r + 1 + int(i % 4)));
  NCCL_OK(ncclAllReduce(in, out, count, dt, ncclSum, v.comm, v.s));
  v.sync();
  std::vector<uint16_t> want(count);
  for (size_t i = 0; i < count; ++i) want[i] = enc(float(v.n * (v.n + 1) / 2 + v.n * int(i % 4)));
  char what[64];
  snprintf(what, sizeof what, "AllReduce(%s,sum)", tname);
  v.check(what, out, want);
  CUDA_OK(cudaFree(in));
  CUDA_OK(cudaFree(out));
}

int run_verify(ncclComm_t world, cudaStream_t s) {
  Verifier v{world, s, 0, 0};
  NCCL_OK(ncclCommCount(world, &v.n));
  NCCL_OK(ncclCommUserRank(world, &v.r));
  const int n = v.n, r = v.r;
  const size_t c = 1031;

  verify_allreduce<float>(v, ncclFloat32, "float32", c);
  verify_allreduce<int32_t>(v, ncclInt32, "int32", c);
  verify_allreduce<double>(v, ncclFloat64, "float64", 300);
  verify_allreduce<int64_t>(v, ncclInt64, "int64", 300);
  verify_allreduce<uint8_t>(v, ncclUint8, "uint8", 100);
  verify_allreduce16(v, ncclFloat16, "float16");
  verify_allreduce16(v, ncclBfloat16, "bfloat16");
  /* a buffer larger than the data segment's first size: exercises growth + remaps */
  verify_allreduce<float>(v, ncclFloat32, "float32-large", (3u << 20) / 4 + 5);

  { /* AllGather, in place (sendbuff = recvbuff + rank * count), as frameworks do */
    int32_t* buf = v.dev<int32_t>(size_t(n) * c);
    for (size_t i = 0; i < c; ++i) buf[size_t(r) * c + i] = r * 100000 + int(i);
    NCCL_OK(ncclAllGather(buf + size_t(r) * c, buf, c, ncclInt32, world, s));
    v.sync();
    std::vector<int32_t> want(size_t(n) * c);
    for (int q = 0; q < n; ++q)
      for (size_t i = 0; i < c; ++i) want[size_t(q) * c + i] = q * 100000 + int(i);
    v.check("AllGather(int32)", buf, want);
    CUDA_OK(cudaFree(buf));
  }
  { /* ReduceScatter */
    float* in = v.dev<float>(size_t(n) * c);
    float* out = v.dev<float>(c);
    for (int j = 0; j < n; ++j)
      for (size_t i = 0; i < c; ++i) in[size_t(j) * c + i] = float(r + 10 * j + int(i % 3));
    NCCL_OK(ncclReduceScatter(in, out, c, ncclFloat32, ncclSum, world, s));
    v.sync();
    std::vector<float> want(c);
    for (size_t i = 0; i < c; ++i) {
      float acc = 0;
      for (int q = 0; q < n; ++q) acc += float(q + 10 * r + int(i % 3));
      want[i] = acc;
    }
    v.check("ReduceScatter(float32,sum)", out, want);
    CUDA_OK(cudaFree(in));
    CUDA_OK(cudaFree(out));
  }
  { /* Broadcast from the last rank, then Bcast (in place) from rank 0 */
    int root = n - 1;
    int32_t* in = v.dev<int32_t>(c);
    int32_t* out = v.dev<int32_t>(c);
    for (size_t i = 0; i < c; ++i) in[i] = r == root ? 7 * int(i) + 3 : -1;
    NCCL_OK(ncclBroadcast(in, out, c, ncclInt32, root, world, s));
    v.sync();
    std::vector<int32_t> want(c);
    for (size_t i = 0; i < c; ++i) want[i] = 7 * int(i) + 3;
    v.check("Broadcast(int32)", out, want);
    for (size_t i = 0; i < c; ++i) out[i] = r == 0 ? 5 * int(i) : -2;
    NCCL_OK(ncclBcast(out, c, ncclInt32, 0, world, s));
    v.sync();
    for (size_t i = 0; i < c; ++i) want[i] = 5 * int(i);
    v.check("Bcast(int32)", out, want);
    CUDA_OK(cudaFree(in));
    CUDA_OK(cudaFree(out));
  }
  { /* Reduce to rank 1 % n */
    int root = 1 % n;
    int32_t* in = v.dev<int32_t>(c);
    int32_t* out = v.dev<int32_t>(c);
    for (size_t i = 0; i < c; ++i) {
      in[i] = r * 3 + int(i);
      out[i] = -7;
    }
    NCCL_OK(ncclReduce(in, out, c, ncclInt32, ncclMax, root, world, s));
    v.sync();
    std::vector<int32_t> want(c);
    for (size_t i = 0; i < c; ++i) want[i] = r == root ? (n - 1) * 3 + int(i) : -7;
    v.check("Reduce(int32,max)", out, want);
    CUDA_OK(cudaFree(in));
    CUDA_OK(cudaFree(out));
  }
  { /* AlltoAll */
    int32_t* in = v.dev<int32_t>(size_t(n) * c);
    int32_t* out = v.dev<int32_t>(size_t(n) * c);
    for (int j = 0; j < n; ++j)
      for (size_t i = 0; i < c; ++i) in[size_t(j) * c + i] = r * 1000000 + j * 1000 + int(i % 1000);
    NCCL_OK(ncclAlltoAll(in, out, c, ncclInt32, world, s));
    v.sync();
    std::vector<int32_t> want(size_t(n) * c);
    for (int j = 0; j < n; ++j)
      for (size_t i = 0; i < c; ++i) want[size_t(j) * c + i] = j * 1000000 + r * 1000 + int(i % 1000);
    v.check("AlltoAll(int32)", out, want);
    CUDA_OK(cudaFree(in));
    CUDA_OK(cudaFree(out));
  }
  { /* Gather to rank 0, Scatter from the last rank */
    int32_t* in = v.dev<int32_t>(size_t(n) * c);
    int32_t* out = v.dev<int32_t>(size_t(n) * c);
    for (size_t i = 0; i < c; ++i) in[i] = r * 7 + int(i);
    for (size_t i = 0; i < size_t(n) * c; ++i) out[i] = -3;
    NCCL_OK(ncclGather(in, out, c, ncclInt32, 0, world, s));
    v.sync();
    std::vector<int32_t> want(size_t(n) * c, -3);
    if (r == 0)
      for (int q = 0; q < n; ++q)
        for (size_t i = 0; i < c; ++i) want[size_t(q) * c + i] = q * 7 + int(i);
    v.check("Gather(int32)", out, want);
    int root = n - 1;
    for (int j = 0; j < n; ++j)
      for (size_t i = 0; i < c; ++i) in[size_t(j) * c + i] = r == root ? j * 3 + int(i) : -1;
    NCCL_OK(ncclScatter(in, out, c, ncclInt32, root, world, s));
    v.sync();
    want.assign(c, 0);
    for (size_t i = 0; i < c; ++i) want[i] = r * 3 + int(i);
    v.check("Scatter(int32)", out, want);
    CUDA_OK(cudaFree(in));
    CUDA_OK(cudaFree(out));
  }
  { /* Send/Recv ring in one group (each rank sends right, receives from the left),
       then both directions at once */
    int32_t* in = v.dev<int32_t>(c);
    int32_t* left = v.dev<int32_t>(c);
    int32_t* right = v.dev<int32_t>(c);
    for (size_t i = 0; i < c; ++i) in[i] = r * 11 + int(i);
    int nx = (r + 1) % n, pv = (r + n - 1) % n;
    NCCL_OK(ncclGroupStart());
    NCCL_OK(ncclSend(in, c, ncclInt32, nx, world, s));
    NCCL_OK(ncclRecv(left, c, ncclInt32, pv, world, s));
    NCCL_OK(ncclGroupEnd());
    v.sync();
    std::vector<int32_t> want(c);
    for (size_t i = 0; i < c; ++i) want[i] = pv * 11 + int(i);
    v.check("SendRecv ring(int32)", left, want);
    NCCL_OK(ncclGroupStart());
    NCCL_OK(ncclSend(in, c, ncclInt32, nx, world, s));
    NCCL_OK(ncclSend(in, c, ncclInt32, pv, world, s));
    NCCL_OK(ncclRecv(left, c, ncclInt32, pv, world, s));
    NCCL_OK(ncclRecv(right, c, ncclInt32, nx, world, s));
    NCCL_OK(ncclGroupEnd());
    v.sync();
    v.check("SendRecv both ways, from left(int32)", left, want);
    for (size_t i = 0; i < c; ++i) want[i] = nx * 11 + int(i);
    v.check("SendRecv both ways, from right(int32)", right, want);
    CUDA_OK(cudaFree(in));
    CUDA_OK(cudaFree(left));
    CUDA_OK(cudaFree(right));
  }
  { /* a group of collectives, and count 0 (queues nothing) */
    float* a = v.dev<float>(c);
    float* b = v.dev<float>(c);
    int32_t* g = v.dev<int32_t>(size_t(n));
    int32_t mine = r + 1;
    for (size_t i = 0; i < c; ++i) a[i] = float(r);
    NCCL_OK(ncclGroupStart());
    NCCL_OK(ncclAllReduce(a, b, c, ncclFloat32, ncclSum, world, s));
    NCCL_OK(ncclAllGather(&mine, g, 1, ncclInt32, world, s));
    NCCL_OK(ncclAllReduce(nullptr, nullptr, 0, ncclFloat32, ncclSum, world, s));
    NCCL_OK(ncclGroupEnd());
    v.sync();
    std::vector<float> wa(c, float(n * (n - 1) / 2));
    v.check("grouped AllReduce(float32,sum)", b, wa);
    std::vector<int32_t> wg(static_cast<size_t>(n));
    for (int q = 0; q < n; ++q) wg[size_t(q)] = q + 1;
    v.check("grouped AllGather(int32)", g, wg);
    CUDA_OK(cudaFree(a));
    CUDA_OK(cudaFree(b));
    CUDA_OK(cudaFree(g));
  }
  { /* Split by parity, keys reversed; then a split where rank 0 opts out */
    ncclComm_t half = nullptr, rest = nullptr;
    NCCL_OK(ncclCommSplit(world, r % 2, -r, &half, nullptr));
    int hn = 0, hr = 0;
    NCCL_OK(ncclCommCount(half, &hn));
    NCCL_OK(ncclCommUserRank(half, &hr));
    /* keys are -rank: ranks of my parity above me come first */
    int want_n = 0, want_r = 0;
    for (int q = r % 2; q < n; q += 2) {
      ++want_n;
      if (q > r) ++want_r;
    }
    if (hn != want_n || hr != want_r) {
      printf("verify FAILED: CommSplit: rank %d got (n=%d, rank=%d) expected (n=%d, rank=%d)\n", r, hn, hr, want_n,
             want_r);
      return 1;
    }
    int64_t* x = v.dev<int64_t>(1);
    *x = r;
    v.comm = half;
    NCCL_OK(ncclAllReduce(x, x, 1, ncclInt64, ncclSum, half, s));
    v.sync();
    int64_t sum = 0;
    for (int q = r % 2; q < n; q += 2) sum += q;
    v.check("AllReduce on split comm(int64)", x, std::vector<int64_t>{sum});
    v.comm = world;
    NCCL_OK(ncclCommSplit(world, r == 0 ? -1 : 0, 0, &rest, nullptr));
    if ((r == 0) != (rest == nullptr)) {
      printf("verify FAILED: CommSplit NOCOLOR: rank %d got comm %p\n", r, (void*)rest);
      return 1;
    }
    if (rest) {
      *x = 1;
      NCCL_OK(ncclAllReduce(x, x, 1, ncclInt64, ncclSum, rest, s));
      CUDA_OK(cudaStreamSynchronize(s));
      v.check("AllReduce on split comm without rank 0(int64)", x, std::vector<int64_t>{int64_t(n - 1)});
      NCCL_OK(ncclCommDestroy(rest));
    }
    NCCL_OK(ncclCommDestroy(half));
    CUDA_OK(cudaFree(x));
  }
  printf("verify ok\n");
  return 0;
}

/* ---- training ---- */

struct Rng { /* xorshift64*: compute-time jitter, deterministic per (seed, rank) */
  uint64_t s;
  double uniform() {
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    return double((s * 2685821657736338717ull) >> 11) * (1.0 / 9007199254740992.0);
  }
};

double env_fraction(const char* name, double def) {
  const char* s = getenv(name);
  if (!s || !*s) return def;
  char* end = nullptr;
  double v = strtod(s, &end);
  return (*end || !(v >= 0 && v < 0.9)) ? def : v; /* simnccl already reported a bad value */
}

/* A mismatch fault's world collective: the others all-reduce one float (two for dtype-hang; or,
 * for what=root, broadcast it from a root other than the faulty rank); the faulty rank calls a
 * broadcast, two elements, int32, names itself the root, four elements (count-hang) or two
 * float64 (dtype-hang). `buf` holds at least 16 bytes. */
void world_probe(float* buf, simfault::What what, int faulty_rank, int rank, ncclComm_t world, cudaStream_t s) {
  using W = simfault::What;
  const bool faulty = rank == faulty_rank;
  if (what == W::Root) {
    const int root = faulty ? rank : (faulty_rank == 0 ? 1 : 0);
    NB_OK(ncclBroadcast(buf, buf, 1, ncclFloat32, root, world, s), world);
  } else if (faulty && what == W::Op) {
    NB_OK(ncclBroadcast(buf, buf, 1, ncclFloat32, 0, world, s), world);
  } else if (faulty && what == W::Count) {
    NB_OK(ncclAllReduce(buf, buf, 2, ncclFloat32, ncclSum, world, s), world);
  } else if (faulty && what == W::Dtype) {
    NB_OK(ncclAllReduce(buf, buf, 1, ncclInt32, ncclSum, world, s), world);
  } else if (faulty && what == W::CountHang) {
    NB_OK(ncclAllReduce(buf, buf, 4, ncclFloat32, ncclSum, world, s), world);
  } else if (what == W::DtypeHang) {
    NB_OK(ncclAllReduce(buf, buf, 2, faulty ? ncclFloat64 : ncclFloat32, ncclSum, world, s), world);
  } else {
    NB_OK(ncclAllReduce(buf, buf, 1, ncclFloat32, ncclSum, world, s), world);
  }
}

int run_training(const Args& a, ncclComm_t world, cudaStream_t s, int rank, int world_size) {
  const int tp = int(a.tp), pp = int(a.pp);
  if (world_size % (tp * pp) != 0) die("WORLD_SIZE=%d is not a multiple of tp*pp=%d", world_size, tp * pp);
  const int dp = world_size / (tp * pp);
  const int tp_idx = rank % tp, dp_idx = (rank / tp) % dp, pp_idx = rank / (tp * dp);
  ncclComm_t tpc, dpc, ppc;
  NB_OK(ncclCommSplit(world, rank / tp, rank, &tpc, nullptr), world);
  if (g_nonblocking) NB_OK(ncclInProgress, tpc); /* a split child inherits nonblocking */
  NB_OK(ncclCommSplit(world, pp_idx * tp + tp_idx, rank, &dpc, nullptr), world);
  if (g_nonblocking) NB_OK(ncclInProgress, dpc); /* a split child inherits nonblocking */
  NB_OK(ncclCommSplit(world, dp_idx * tp + tp_idx, rank, &ppc, nullptr), world);
  if (g_nonblocking) NB_OK(ncclInProgress, ppc); /* a split child inherits nonblocking */

  /* this rank's driver-level faults (simnccl reports malformed specs; fault_spec.h) */
  long crash_step = -1, hang_step = -1, slow_step = -1, slow_until = -1, skip_step = -1, barrier_step = -1;
  long probe_step = -1, probe_rank = -1; /* mismatch what=op|count|dtype|root */
  simfault::What probe_what = simfault::What::Skip;
  double slow_factor = 1, hang_secs = 0;
  for (const simfault::Fault& f : simfault::parse_faults(getenv("SIMNCCL_FAULTS")).faults) {
    if (f.kind == simfault::Kind::Mismatch && f.what != simfault::What::Skip) {
      probe_step = f.step, probe_rank = f.rank, probe_what = f.what; /* every rank joins the probe */
      continue;
    }
    if (f.kind == simfault::Kind::Mismatch) barrier_step = f.step; /* every rank joins the world op */
    if (f.rank != rank) continue;
    auto earliest = [&](long cur) { return cur < 0 || f.step < cur ? long(f.step) : cur; };
    if (f.kind == simfault::Kind::Crash) crash_step = earliest(crash_step);
    if (f.kind == simfault::Kind::Mismatch) skip_step = f.step;
    if (f.kind == simfault::Kind::NonCommHang) {
      hang_step = earliest(hang_step);
      hang_secs = f.secs;
    }
    if (f.kind == simfault::Kind::NonCommSlow) {
      slow_step = earliest(slow_step);
      slow_until = f.until;
      slow_factor = f.factor;
    }
  }

  const size_t tpn = size_t(a.tp_bytes) / 4, dpn = size_t(a.dp_bytes) / 4, ppn = size_t(a.pp_bytes) / 4;
  float *ag_in, *ag_out, *rs_in, *rs_out, *grad, *act_out, *act_in, *g_out, *g_in;
  CUDA_OK(cudaMalloc((void**)&ag_in, tpn * 4));
  CUDA_OK(cudaMalloc((void**)&ag_out, tpn * 4 * size_t(tp)));
  CUDA_OK(cudaMalloc((void**)&rs_in, tpn * 4 * size_t(tp)));
  CUDA_OK(cudaMalloc((void**)&rs_out, tpn * 4));
  CUDA_OK(cudaMalloc((void**)&grad, dpn * 4));
  CUDA_OK(cudaMalloc((void**)&act_out, ppn * 4));
  CUDA_OK(cudaMalloc((void**)&act_in, ppn * 4));
  CUDA_OK(cudaMalloc((void**)&g_out, ppn * 4));
  CUDA_OK(cudaMalloc((void**)&g_in, ppn * 4));
  CUDA_OK(cudaMemset(ag_in, 0, tpn * 4));
  CUDA_OK(cudaMemset(rs_in, 0, tpn * 4 * size_t(tp)));
  CUDA_OK(cudaMemset(grad, 0, dpn * 4));
  float* probe_buf = nullptr; /* the mismatch probe's two floats */
  CUDA_OK(cudaMalloc((void**)&probe_buf, 16));
  CUDA_OK(cudaMemset(probe_buf, 0, 16));
  CUDA_OK(cudaMemset(act_out, 0, ppn * 4));
  CUDA_OK(cudaMemset(g_out, 0, ppn * 4));

  const double jitter = env_fraction("SIMNCCL_JITTER", 0.03);
  const char* seed_s = getenv("SIMNCCL_SEED");
  Rng rng{0x9e3779b97f4a7c15ull ^ (uint64_t(seed_s ? strtoull(seed_s, nullptr, 10) : 1) * 1000003ull + uint64_t(rank))};
  if (!rng.s) rng.s = 1;
  auto compute = [&](long step, double share) {
    if (hang_step >= 0 && step >= hang_step && hang_secs <= 0) {
      CUDA_OK(simLaunchCompute(s, SIM_COMPUTE_FOREVER)); /* stuck stream: later ops never arrive */
      return;
    }
    double ns = double(a.compute_us) * 1000.0 * share * (1.0 + jitter * (2.0 * rng.uniform() - 1.0));
    if (hang_step >= 0 && step == hang_step && share < 0.5) ns += hang_secs * 1e9; /* transient stall */
    if (slow_step >= 0 && step >= slow_step && (slow_until < 0 || step < slow_until)) ns *= slow_factor;
    CUDA_OK(simLaunchCompute(s, uint64_t(ns > 0 ? ns : 0)));
  };

  for (long step = 0; step < a.steps; ++step) {
    uint64_t t_step = mono_ns();
    simSetStep(int(step));
    if (crash_step >= 0 && step >= crash_step) {
      fprintf(stderr, "c4d-simtrain: rank %d: injected crash at step %ld\n", rank, step);
      raise(SIGKILL); /* abrupt: no destructors, no comm teardown, shm left behind */
    }
    if (pp_idx > 0) { /* forward: activations from the previous stage */
      NCCL_OK(ncclGroupStart());
      NCCL_OK(ncclRecv(act_in, ppn, ncclFloat32, pp_idx - 1, ppc, s));
      NB_OK(ncclGroupEnd(), ppc);
    }
    compute(step, 1.0 / 3.0);
    NB_OK(ncclAllGather(ag_in, ag_out, tpn, ncclFloat32, tpc, s), tpc);
    if (pp_idx < pp - 1) { /* activations out, their gradients back */
      NCCL_OK(ncclGroupStart());
      NCCL_OK(ncclSend(act_out, ppn, ncclFloat32, pp_idx + 1, ppc, s));
      NCCL_OK(ncclRecv(g_in, ppn, ncclFloat32, pp_idx + 1, ppc, s));
      NB_OK(ncclGroupEnd(), ppc);
    }
    compute(step, 2.0 / 3.0);
    const bool skip = step == skip_step; /* mismatch fault: this rank leaves one collective out */
    if (!(skip && tp > 1)) NB_OK(ncclReduceScatter(rs_in, rs_out, tpn, ncclFloat32, ncclSum, tpc, s), tpc);
    if (pp_idx > 0) {
      NCCL_OK(ncclGroupStart());
      NCCL_OK(ncclSend(g_out, ppn, ncclFloat32, pp_idx - 1, ppc, s));
      NB_OK(ncclGroupEnd(), ppc);
    }
    if (!(skip && tp == 1)) NB_OK(ncclAllReduce(grad, grad, dpn, ncclFloat32, ncclSum, dpc, s), dpc);
    if (step == barrier_step) NB_OK(ncclAllReduce(grad, grad, 1, ncclFloat32, ncclSum, world, s), world);
    if (step == probe_step) world_probe(probe_buf, probe_what, int(probe_rank), rank, world, s);
    CUDA_OK(cudaStreamSynchronize(s));
    for (ncclComm_t c : {tpc, dpc, ppc}) { /* what a framework's NCCL watchdog does */
      ncclResult_t ae = ncclSuccess;
      NCCL_OK(ncclCommGetAsyncError(c, &ae));
      if (ae != ncclSuccess) die("step %ld: NCCL async error: %s", step, ncclGetErrorString(ae));
    }
    if (a.progress)
      fprintf(stderr, "c4d-simtrain: rank %d step %ld done ms=%.3f\n", rank, step, double(mono_ns() - t_step) / 1e6);
  }
  NCCL_OK(ncclCommDestroy(tpc));
  NCCL_OK(ncclCommDestroy(dpc));
  NCCL_OK(ncclCommDestroy(ppc));
  for (float* p : {ag_in, ag_out, rs_in, rs_out, grad, act_out, act_in, g_out, g_in, probe_buf}) CUDA_OK(cudaFree(p));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a = parse_args(argc, argv);
  if (a.bench) return run_bench(a.bench, a.bench_threads, a.bench_group, a.bench_events);
  if (a.bench_cuda) return run_bench_cuda(a.bench_cuda);
  g_rank = int(env_int("RANK", 0, true));
  const int world_size = int(env_int("WORLD_SIZE", 1, true));
  const int local_rank = int(env_int("LOCAL_RANK", g_rank, false));
  if (g_rank >= world_size) die("RANK=%d is not below WORLD_SIZE=%d", g_rank, world_size);
  struct stat st;
  if (stat(a.job_dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) die("--job-dir %s is not a directory", a.job_dir.c_str());

  int ndev = 1;
  CUDA_OK(cudaGetDeviceCount(&ndev));
  CUDA_OK(cudaSetDevice(local_rank % ndev));
  cudaStream_t s;
  CUDA_OK(cudaStreamCreate(&s));

  ncclUniqueId id;
  if (g_rank == 0) {
    NCCL_OK(ncclGetUniqueId(&id));
    publish_id(a.job_dir, id);
  } else {
    id = wait_id(a.job_dir, a.init_timeout_s);
  }
  ncclComm_t world;
  g_nonblocking = a.nonblocking;
  if (a.nonblocking) {
    c4d_nccl_config_head config{sizeof(c4d_nccl_config_head), NCCL_API_MAGIC, 23102, 0};
    NB_OK(ncclCommInitRankConfig(&world, world_size, id, g_rank, reinterpret_cast<ncclConfig_t*>(&config)), world);
  } else {
    NCCL_OK(ncclCommInitRank(&world, world_size, id, g_rank));
  }
  if (a.progress) fprintf(stderr, "c4d-simtrain: rank %d ready (world %d)\n", g_rank, world_size);

  int rc = a.verify ? run_verify(world, s) : run_training(a, world, s, g_rank, world_size);
  fflush(stdout);
  if (rc != 0) return rc;
  NCCL_OK(ncclCommDestroy(world));
  CUDA_OK(cudaStreamDestroy(s));
  if (a.nonblocking) printf("nccl last error: '%s'\n", ncclGetLastError(nullptr));
  if (a.progress) fprintf(stderr, "c4d-simtrain: rank %d finished\n", g_rank);
  return 0;
}
