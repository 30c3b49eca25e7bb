// C entry points of the CPU emulation (see cpu_backend.h), loaded by tests/test_cuda.py
// with ctypes. Build: g++ -O1 -std=c++17 -shared -fPIC -I../include emulate.cpp.
//
// Every function returns 0 on success, else 1 with a message copied into err[0:errlen).
// Arrays are row-major batch x n x n, exactly what the CUDA handlers receive.
#include <cstdint>
#include <cstring>
#include <string>

#include "cpu_backend.h"
#include "gpchol/algorithms.h"
#include "gpchol/small.h"

namespace {

using gpchol::index_t;
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

template <typename T>
int potrf(const T* in, T* out, std::int32_t* status, index_t batch, index_t n, index_t tile,
          std::uint64_t seed, char* err, int errlen) {
  CpuBackend be(seed);
  const size_t bytes = sizeof(T) * static_cast<size_t>(batch * n * n);
  be.add_buffer(in, bytes);
  be.add_buffer(out, bytes);
  be.add_buffer(status, sizeof(std::int32_t) * static_cast<size_t>(batch));
  return finish(gpchol::potrf_forward<T>(be, in, out, status, batch, n, tile), err, errlen);
}

template <typename T>
int adjoint(const T* L, const T* lbar, T* g, index_t batch, index_t n, index_t block,
            std::uint64_t seed, char* err, int errlen) {
  CpuBackend be(seed);
  const size_t bytes = sizeof(T) * static_cast<size_t>(batch * n * n);
  be.add_buffer(L, bytes);
  be.add_buffer(lbar, bytes);
  be.add_buffer(g, bytes);
  return finish(gpchol::potrf_adjoint<T>(be, L, lbar, g, batch, n, block), err, errlen);
}

template <typename T>
int small_potrf(const T* in, T* out, std::int32_t* status, index_t batch, index_t n,
                std::uint64_t seed, char* err, int errlen) {
  CpuBackend be(seed);
  return finish(be.small_potrf<T>(in, out, status, batch, static_cast<int>(n)), err, errlen);
}

template <typename T>
int small_adjoint(const T* L, const T* lbar, T* g, index_t batch, index_t n, std::uint64_t seed,
                  char* err, int errlen) {
  CpuBackend be(seed);
  return finish(be.small_adjoint<T>(L, lbar, g, batch, static_cast<int>(n)), err, errlen);
}

}  // namespace

extern "C" {

#define GPCHOL_EMU_EXPORT __attribute__((visibility("default")))

GPCHOL_EMU_EXPORT int gpchol_emu_potrf_f32(const float* in, float* out, std::int32_t* status,
                                           std::int64_t batch, std::int64_t n,
                                           std::int64_t tile, std::uint64_t seed, char* err,
                                           int errlen) {
  return potrf<float>(in, out, status, batch, n, tile, seed, err, errlen);
}
GPCHOL_EMU_EXPORT int gpchol_emu_potrf_f64(const double* in, double* out, std::int32_t* status,
                                           std::int64_t batch, std::int64_t n,
                                           std::int64_t tile, std::uint64_t seed, char* err,
                                           int errlen) {
  return potrf<double>(in, out, status, batch, n, tile, seed, err, errlen);
}
GPCHOL_EMU_EXPORT int gpchol_emu_adjoint_f32(const float* L, const float* lbar, float* g,
                                             std::int64_t batch, std::int64_t n,
                                             std::int64_t block, std::uint64_t seed, char* err,
                                             int errlen) {
  return adjoint<float>(L, lbar, g, batch, n, block, seed, err, errlen);
}
GPCHOL_EMU_EXPORT int gpchol_emu_adjoint_f64(const double* L, const double* lbar, double* g,
                                             std::int64_t batch, std::int64_t n,
                                             std::int64_t block, std::uint64_t seed, char* err,
                                             int errlen) {
  return adjoint<double>(L, lbar, g, batch, n, block, seed, err, errlen);
}
GPCHOL_EMU_EXPORT int gpchol_emu_small_potrf_f32(const float* in, float* out,
                                                 std::int32_t* status, std::int64_t batch,
                                                 std::int64_t n, std::uint64_t seed, char* err,
                                                 int errlen) {
  return small_potrf<float>(in, out, status, batch, n, seed, err, errlen);
}
GPCHOL_EMU_EXPORT int gpchol_emu_small_potrf_f64(const double* in, double* out,
                                                 std::int32_t* status, std::int64_t batch,
                                                 std::int64_t n, std::uint64_t seed, char* err,
                                                 int errlen) {
  return small_potrf<double>(in, out, status, batch, n, seed, err, errlen);
}
GPCHOL_EMU_EXPORT int gpchol_emu_small_adjoint_f32(const float* L, const float* lbar, float* g,
                                                   std::int64_t batch, std::int64_t n,
                                                   std::uint64_t seed, char* err, int errlen) {
  return small_adjoint<float>(L, lbar, g, batch, n, seed, err, errlen);
}
GPCHOL_EMU_EXPORT int gpchol_emu_small_adjoint_f64(const double* L, const double* lbar, double* g,
                                                   std::int64_t batch, std::int64_t n,
                                                   std::uint64_t seed, char* err, int errlen) {
  return small_adjoint<double>(L, lbar, g, batch, n, seed, err, errlen);
}
GPCHOL_EMU_EXPORT int gpchol_emu_small_max_n(int itemsize) {
  return itemsize == 8 ? gpchol::kSmallMaxF64 : gpchol::kSmallMaxF32;
}

}  // extern "C"
