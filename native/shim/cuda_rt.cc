#include "cuda_rt.h"

#include <dlfcn.h>

#include <initializer_list>

#include "log.h"
#include "real_nccl.h"

namespace c4d {

CudaRt g_cuda;

namespace {

bool g_resolved = false;

void* find(void* lib, const char* name) { return dlsym(lib ? lib : RTLD_DEFAULT, name); }

template <typename T>
bool load(void* lib, T* out, const char* name) {
  *out = reinterpret_cast<T>(find(lib, name));
  return *out != nullptr;
}

bool load_all(void* lib) {
  CudaRt r{};
  bool ok = load(lib, &r.eventCreateWithFlags, "cudaEventCreateWithFlags") &&
            load(lib, &r.eventRecord, "cudaEventRecord") && load(lib, &r.eventQuery, "cudaEventQuery") &&
            load(lib, &r.eventElapsedTime, "cudaEventElapsedTime") &&
            load(lib, &r.eventDestroy, "cudaEventDestroy") && load(lib, &r.getDevice, "cudaGetDevice") &&
            load(lib, &r.setDevice, "cudaSetDevice") &&
            load(lib, &r.streamCreateWithFlags, "cudaStreamCreateWithFlags");
  if (!ok) return false;
  load(lib, &r.streamIsCapturing, "cudaStreamIsCapturing");
  load(lib, &r.exchangeCaptureMode, "cudaThreadExchangeStreamCaptureMode");
  r.ok = true;
  g_cuda = r;
  return true;
}

}  // namespace

bool cuda_rt_resolve() {
  if (g_resolved) return g_cuda.ok;
  bool found = load_all(nullptr);
  if (found) C4D_LOG(kDebug, "CUDA runtime found in the global scope");
  for (const char* name : {"libcudart.so.13", "libcudart.so.12", "libcudart.so"}) {
    if (found) break;
    void* lib = dlopen(name, RTLD_NOLOAD | RTLD_LAZY | RTLD_LOCAL);
    if (lib && load_all(lib)) {
      C4D_LOG(kDebug, "CUDA runtime found in the loaded %s", name);
      found = true;  // keep the reference: the runtime outlives us anyway
    } else if (lib) {
      dlclose(lib);
    }
  }
  if (!found) {  // the runtime linked into the library NCCL lives in (NCCL and cudart static in one .so)
    void* lib = real_nccl_handle();
    if (lib && load_all(lib)) {
      C4D_LOG(kDebug, "CUDA runtime found beside the bound NCCL");
      found = true;
    }
  }
  if (!found) C4D_LOG(kInfo, "no CUDA runtime in this process: ops carry host times only");
  g_resolved = true;  // last: a fork child of a thread caught mid-way resolves again
  return found;
}

namespace {
int g_agent_device = -1;  // the agent thread's current device, as it last set it
}

bool cuda_agent_device(int device) {
  if (!g_cuda.ok || device < 0) return false;
  if (device == g_agent_device) return true;
  if (g_cuda.setDevice(device) != C4D_CUDA_SUCCESS) return false;
  if (g_agent_device < 0 && g_cuda.exchangeCaptureMode) {
    // Before the agent's first query: relaxed, so that its cudaEventQuery never invalidates
    // a CUDA graph capture of the application (as NCCL's proxy thread and PyTorch's watchdog
    // do: pytorch#104555, #148594). After cudaSetDevice: no context made on device 0.
    int mode = C4D_CUDA_CAPTURE_MODE_RELAXED;
    if (g_cuda.exchangeCaptureMode(&mode) != C4D_CUDA_SUCCESS) C4D_LOG(kWarning, "agent: relaxed capture mode refused");
  }
  g_agent_device = device;
  return true;
}

void cuda_agent_reset() { g_agent_device = -1; }

int cuda_current_device() {
  int d = -1;
  if (!g_cuda.ok || g_cuda.getDevice(&d) != C4D_CUDA_SUCCESS) return -1;
  return d;
}

}  // namespace c4d
