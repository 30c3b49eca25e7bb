// C entry points of the CPU emulation (see cpu_backend.h), loaded by tests/test_cuda.py
// with ctypes, which also compiles this file (g++ -std=c++17 -shared -fPIC -I../include).
//
// Every function returns 0 on success, else 1 with a message copied into err[0:errlen).
// Arrays are row-major batch x n x n, exactly what the CUDA handlers receive. The options
// (gpchol_emu_options) give the seed of the shuffled execution order, the emulated
// device's shared memory per block and a scratch budget, and report which path a batch of
// small matrices took.
#include <cstdint>
#include <cstring>
#include <string>

#include "cpu_backend.h"
#include "gpchol/algorithms.h"
#include "gpchol/scratch.h"
#include "gpchol/small.h"

extern "C" {
// Mirrored by a ctypes.Structure in tests/test_cuda.py.
struct gpchol_emu_options {
  std::uint64_t seed;                 // order of the shuffled parallel steps
  std::int64_t shared_memory_limit;   // bytes per thread block; <= 0: unlimited
  std::int64_t scratch_budget;        // scratch bytes the allocator grants; < 0: unlimited
  std::int32_t path;                  // out (small entry points): 1 shared memory, 2 large
};
}

namespace {

using gpchol::index_t;
using gpchol::SmallPath;
using gpchol::Status;
using gpchol::emu::CpuBackend;

int finish(const Status& s, char* err, int errlen) {
  if (s.ok()) return 0;
  if (err != nullptr && errlen > 0) {
    std::strncpy(err, s.message().c_str(), static_cast<size_t>(errlen - 1));
    err[errlen - 1] = '\0';
  }
  return 1;
}

CpuBackend make_backend(const gpchol_emu_options* opt) {
  return CpuBackend(opt->seed, opt->shared_memory_limit, opt->scratch_budget);
}

template <typename T>
int potrf(const T* in, T* out, std::int32_t* status, index_t batch, index_t n, index_t tile,
          const gpchol_emu_options* opt, char* err, int errlen) {
  CpuBackend be = make_backend(opt);
  const size_t bytes = sizeof(T) * static_cast<size_t>(batch * n * n);
  be.add_buffer(in, bytes);
  be.add_buffer(out, bytes);
  be.add_buffer(status, sizeof(std::int32_t) * static_cast<size_t>(batch));
  return finish(gpchol::potrf_forward<T>(be, in, out, status, batch, n, tile), err, errlen);
}

template <typename T>
int adjoint(const T* L, const T* lbar, T* g, index_t batch, index_t n, index_t block,
            const gpchol_emu_options* opt, char* err, int errlen) {
  CpuBackend be = make_backend(opt);
  const size_t bytes = sizeof(T) * static_cast<size_t>(batch * n * n);
  be.add_buffer(L, bytes);
  be.add_buffer(lbar, bytes);
  be.add_buffer(g, bytes);
  return finish(gpchol::potrf_adjoint<T>(be, L, lbar, g, batch, n, block), err, errlen);
}

// What the gpchol_potrf_small_* handlers run: the shared-memory kernel, or the large path
// when the (emulated) device's shared memory is too small.
template <typename T>
int small_potrf(const T* in, T* out, std::int32_t* status, index_t batch, index_t n,
                gpchol_emu_options* opt, char* err, int errlen) {
  CpuBackend be = make_backend(opt);
  const size_t bytes = sizeof(T) * static_cast<size_t>(batch * n * n);
  be.add_buffer(in, bytes);
  be.add_buffer(out, bytes);
  be.add_buffer(status, sizeof(std::int32_t) * static_cast<size_t>(batch));
  SmallPath path = SmallPath::kSharedMemory;
  const Status s =
      gpchol::potrf_small_batch<T>(be, in, out, status, batch, static_cast<int>(n), &path);
  opt->path = static_cast<std::int32_t>(path);
  return finish(s, err, errlen);
}

template <typename T>
int small_adjoint(const T* L, const T* lbar, T* g, index_t batch, index_t n,
                  gpchol_emu_options* opt, char* err, int errlen) {
  CpuBackend be = make_backend(opt);
  const size_t bytes = sizeof(T) * static_cast<size_t>(batch * n * n);
  be.add_buffer(L, bytes);
  be.add_buffer(lbar, bytes);
  be.add_buffer(g, bytes);
  SmallPath path = SmallPath::kSharedMemory;
  const Status s =
      gpchol::potrf_adjoint_small_batch<T>(be, L, lbar, g, batch, static_cast<int>(n), &path);
  opt->path = static_cast<std::int32_t>(path);
  return finish(s, err, errlen);
}

}  // namespace

extern "C" {

#define GPCHOL_EMU_EXPORT __attribute__((visibility("default")))

GPCHOL_EMU_EXPORT int gpchol_emu_potrf_f32(const float* in, float* out, std::int32_t* status,
                                           std::int64_t batch, std::int64_t n,
                                           std::int64_t tile, gpchol_emu_options* opt,
                                           char* err, int errlen) {
  return potrf<float>(in, out, status, batch, n, tile, opt, err, errlen);
}
GPCHOL_EMU_EXPORT int gpchol_emu_potrf_f64(const double* in, double* out, std::int32_t* status,
                                           std::int64_t batch, std::int64_t n,
                                           std::int64_t tile, gpchol_emu_options* opt,
                                           char* err, int errlen) {
  return potrf<double>(in, out, status, batch, n, tile, opt, err, errlen);
}
GPCHOL_EMU_EXPORT int gpchol_emu_adjoint_f32(const float* L, const float* lbar, float* g,
                                             std::int64_t batch, std::int64_t n,
                                             std::int64_t block, gpchol_emu_options* opt,
                                             char* err, int errlen) {
  return adjoint<float>(L, lbar, g, batch, n, block, opt, err, errlen);
}
GPCHOL_EMU_EXPORT int gpchol_emu_adjoint_f64(const double* L, const double* lbar, double* g,
                                             std::int64_t batch, std::int64_t n,
                                             std::int64_t block, gpchol_emu_options* opt,
                                             char* err, int errlen) {
  return adjoint<double>(L, lbar, g, batch, n, block, opt, err, errlen);
}
GPCHOL_EMU_EXPORT int gpchol_emu_small_potrf_f32(const float* in, float* out,
                                                 std::int32_t* status, std::int64_t batch,
                                                 std::int64_t n, gpchol_emu_options* opt,
                                                 char* err, int errlen) {
  return small_potrf<float>(in, out, status, batch, n, opt, err, errlen);
}
GPCHOL_EMU_EXPORT int gpchol_emu_small_potrf_f64(const double* in, double* out,
                                                 std::int32_t* status, std::int64_t batch,
                                                 std::int64_t n, gpchol_emu_options* opt,
                                                 char* err, int errlen) {
  return small_potrf<double>(in, out, status, batch, n, opt, err, errlen);
}
GPCHOL_EMU_EXPORT int gpchol_emu_small_adjoint_f32(const float* L, const float* lbar, float* g,
                                                   std::int64_t batch, std::int64_t n,
                                                   gpchol_emu_options* opt, char* err,
                                                   int errlen) {
  return small_adjoint<float>(L, lbar, g, batch, n, opt, err, errlen);
}
GPCHOL_EMU_EXPORT int gpchol_emu_small_adjoint_f64(const double* L, const double* lbar,
                                                   double* g, std::int64_t batch,
                                                   std::int64_t n, gpchol_emu_options* opt,
                                                   char* err, int errlen) {
  return small_adjoint<double>(L, lbar, g, batch, n, opt, err, errlen);
}

// The emulated XLA allocator on its own: `bytes` at `alignment`; *offset = the pointer
// modulo kScratchAlignment.
GPCHOL_EMU_EXPORT int gpchol_emu_allocate(std::uint64_t bytes, std::uint64_t alignment,
                                          std::uint64_t* offset, char* err, int errlen) {
  CpuBackend be(0);
  void* p = nullptr;
  const Status s = be.allocate(bytes, alignment, &p);
  if (s.ok()) *offset = reinterpret_cast<std::uintptr_t>(p) % gpchol::kScratchAlignment;
  return finish(s, err, errlen);
}

// Be::scratch, as the drivers call it; *offset = the pointer modulo kScratchAlignment.
GPCHOL_EMU_EXPORT int gpchol_emu_scratch(std::uint64_t bytes, gpchol_emu_options* opt,
                                         std::uint64_t* offset, char* err, int errlen) {
  CpuBackend be = make_backend(opt);
  void* p = nullptr;
  Status s = be.scratch(bytes, &p);
  if (s.ok()) {
    *offset = reinterpret_cast<std::uintptr_t>(p) % gpchol::kScratchAlignment;
    s = be.zero(p, bytes);  // the whole requested range lies inside the allocation
  }
  return finish(s, err, errlen);
}

GPCHOL_EMU_EXPORT int gpchol_emu_scratch_request_alignment() {
  return static_cast<int>(gpchol::kScratchRequestAlignment);
}
GPCHOL_EMU_EXPORT int gpchol_emu_scratch_alignment() {
  return static_cast<int>(gpchol::kScratchAlignment);
}
GPCHOL_EMU_EXPORT int gpchol_emu_small_max_n(int itemsize) {
  return itemsize == 8 ? gpchol::kSmallMaxF64 : gpchol::kSmallMaxF32;
}
// Threads per block of the small kernels for n, and their __launch_bounds__ (the CUDA
// backend launches small_threads(n) threads for n <= small_max_n).
GPCHOL_EMU_EXPORT int gpchol_emu_small_threads(int n) { return gpchol::small_threads(n); }
GPCHOL_EMU_EXPORT int gpchol_emu_small_max_threads(int itemsize) {
  return itemsize == 8 ? gpchol::small_max_threads<double>() : gpchol::small_max_threads<float>();
}
// Same as gpchol_small_smem_bytes of the CUDA library.
GPCHOL_EMU_EXPORT long long gpchol_emu_small_smem_bytes(int itemsize, int n, int adjoint) {
  if (itemsize == 8) {
    return adjoint ? gpchol::small_adjoint_smem<double>(n) : gpchol::small_potrf_smem<double>(n);
  }
  return adjoint ? gpchol::small_adjoint_smem<float>(n) : gpchol::small_potrf_smem<float>(n);
}

}  // extern "C"
