// XLA FFI handlers of gpchol's CUDA kernels (shared by handlers_f32.cu and
// handlers_f64.cu, one translation unit per dtype so that they compile in parallel),
// registered from Python (gpchol/_cuda/ffi.py) for the "CUDA" platform.
//
//   gpchol_potrf_{f32,f64}(a) -> (l, status)          attr tile_size: int64 (0 = cuSOLVER)
//   gpchol_potrf_adjoint_{f32,f64}(l, lbar) -> g      attr tile_size: int64 (0 = default)
//   gpchol_potrf_small_{f32,f64}(a) -> (l, status)    n <= 64 (f64) / 128 (f32)
//   gpchol_potrf_adjoint_small_{f32,f64}(l, lbar) -> g
//
// The small targets run the shared-memory kernels, or the large path when the device's
// shared memory per block is too small for them (potrf_small_batch in algorithms.h).
// Scratch device memory comes from XLA's allocator (XlaScratch), whose error messages
// reach Python.
//
// Shapes: a, l, lbar, g are (..., n, n) row-major; status is (...) int32. The leading
// dimensions are one flattened batch. Python aliases a -> l and lbar -> g
// (input_output_aliases), so the work is in place; the handlers also accept distinct
// buffers and copy first.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "cuda_backend.h"
#include "gpchol/algorithms.h"
#include "gpchol/small.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace gpchol::cuda {

// Reads (..., n, n) into (batch, n); checks the other buffers' shapes against it.
inline ffi::Error square_batch(ffi::Span<const std::int64_t> dims, const char* op, index_t* batch,
                        index_t* n) {
  if (dims.size() < 2 || dims[dims.size() - 1] != dims[dims.size() - 2]) {
    return ffi::Error::InvalidArgument(std::string(op) +
                                       ": expected a (..., n, n) array of square matrices");
  }
  *n = dims[dims.size() - 1];
  index_t b = 1;
  for (size_t i = 0; i + 2 < dims.size(); ++i) b *= dims[i];
  *batch = b;
  return ffi::Error::Success();
}

inline bool same_dims(ffi::Span<const std::int64_t> a, ffi::Span<const std::int64_t> b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i]) return false;
  return true;
}

inline bool is_batch_of(ffi::Span<const std::int64_t> status, ffi::Span<const std::int64_t> a) {
  if (status.size() + 2 != a.size()) return false;
  for (size_t i = 0; i < status.size(); ++i)
    if (status[i] != a[i]) return false;
  return true;
}

inline ffi::Error to_ffi(const Status& s, const char* op) {
  if (s.ok()) return ffi::Error::Success();
  return ffi::Error::Internal(std::string(op) + ": " + s.message());
}

template <ffi::DataType DT>
ffi::Error potrf_impl(cudaStream_t stream, XlaScratch scratch, std::int32_t device,
                      std::int64_t tile_size, ffi::Buffer<DT> a, ffi::ResultBuffer<DT> l,
                      ffi::ResultBuffer<ffi::S32> status) {
  using T = ffi::NativeType<DT>;
  constexpr const char* op = "gpchol_potrf";
  index_t batch = 0, n = 0;
  if (auto e = square_batch(a.dimensions(), op, &batch, &n); e.failure()) return e;
  if (!same_dims(a.dimensions(), l->dimensions()) ||
      !is_batch_of(status->dimensions(), a.dimensions())) {
    return ffi::Error::InvalidArgument("gpchol_potrf: output shapes do not match the input");
  }
  if (batch == 0) return ffi::Error::Success();
  DeviceGuard guard(device);
  if (!guard.status().ok()) return to_ffi(guard.status(), op);
  CudaBackend be(stream, device, scratch);
  return to_ffi(potrf_forward<T>(be, a.typed_data(), l->typed_data(), status->typed_data(),
                                 batch, n, tile_size),
                op);
}

template <ffi::DataType DT>
ffi::Error adjoint_impl(cudaStream_t stream, XlaScratch scratch, std::int32_t device,
                        std::int64_t tile_size, ffi::Buffer<DT> L, ffi::Buffer<DT> lbar,
                        ffi::ResultBuffer<DT> g) {
  using T = ffi::NativeType<DT>;
  constexpr const char* op = "gpchol_potrf_adjoint";
  index_t batch = 0, n = 0;
  if (auto e = square_batch(L.dimensions(), op, &batch, &n); e.failure()) return e;
  if (!same_dims(L.dimensions(), lbar.dimensions()) ||
      !same_dims(L.dimensions(), g->dimensions())) {
    return ffi::Error::InvalidArgument(
        "gpchol_potrf_adjoint: L, its cotangent and the gradient must have the same shape");
  }
  if (batch == 0 || n == 0) return ffi::Error::Success();
  DeviceGuard guard(device);
  if (!guard.status().ok()) return to_ffi(guard.status(), op);
  CudaBackend be(stream, device, scratch);
  return to_ffi(potrf_adjoint<T>(be, L.typed_data(), lbar.typed_data(), g->typed_data(), batch,
                                 n, tile_size),
                op);
}

// The small-matrix targets run the shared-memory kernels, or the large path where the
// device's shared memory per block is too small for them (potrf_small_batch).
template <ffi::DataType DT>
ffi::Error small_potrf_impl(cudaStream_t stream, XlaScratch scratch, std::int32_t device,
                            ffi::Buffer<DT> a, ffi::ResultBuffer<DT> l,
                            ffi::ResultBuffer<ffi::S32> status) {
  using T = ffi::NativeType<DT>;
  constexpr const char* op = "gpchol_potrf_small";
  index_t batch = 0, n = 0;
  if (auto e = square_batch(a.dimensions(), op, &batch, &n); e.failure()) return e;
  if (!same_dims(a.dimensions(), l->dimensions()) ||
      !is_batch_of(status->dimensions(), a.dimensions())) {
    return ffi::Error::InvalidArgument("gpchol_potrf_small: output shapes do not match the input");
  }
  if (n > small_max_n<T>()) {
    return ffi::Error::InvalidArgument("gpchol_potrf_small: n = " + std::to_string(n) +
                                       " exceeds the small-kernel limit " +
                                       std::to_string(small_max_n<T>()));
  }
  if (batch == 0) return ffi::Error::Success();
  DeviceGuard guard(device);
  if (!guard.status().ok()) return to_ffi(guard.status(), op);
  CudaBackend be(stream, device, scratch);
  SmallPath path = SmallPath::kSharedMemory;
  return to_ffi(potrf_small_batch<T>(be, a.typed_data(), l->typed_data(), status->typed_data(),
                                     batch, static_cast<int>(n), &path),
                op);
}

template <ffi::DataType DT>
ffi::Error small_adjoint_impl(cudaStream_t stream, XlaScratch scratch, std::int32_t device,
                              ffi::Buffer<DT> L, ffi::Buffer<DT> lbar, ffi::ResultBuffer<DT> g) {
  using T = ffi::NativeType<DT>;
  constexpr const char* op = "gpchol_potrf_adjoint_small";
  index_t batch = 0, n = 0;
  if (auto e = square_batch(L.dimensions(), op, &batch, &n); e.failure()) return e;
  if (!same_dims(L.dimensions(), lbar.dimensions()) ||
      !same_dims(L.dimensions(), g->dimensions())) {
    return ffi::Error::InvalidArgument(
        "gpchol_potrf_adjoint_small: L, its cotangent and the gradient must have the same "
        "shape");
  }
  if (n > small_max_n<T>()) {
    return ffi::Error::InvalidArgument("gpchol_potrf_adjoint_small: n = " + std::to_string(n) +
                                       " exceeds the small-kernel limit " +
                                       std::to_string(small_max_n<T>()));
  }
  if (batch == 0 || n == 0) return ffi::Error::Success();
  DeviceGuard guard(device);
  if (!guard.status().ok()) return to_ffi(guard.status(), op);
  CudaBackend be(stream, device, scratch);
  SmallPath path = SmallPath::kSharedMemory;
  return to_ffi(potrf_adjoint_small_batch<T>(be, L.typed_data(), lbar.typed_data(),
                                             g->typed_data(), batch, static_cast<int>(n), &path),
                op);
}

}  // namespace gpchol::cuda

// ---- handler symbol definitions -----------------------------------------------------------
//
// The library is compiled with hidden visibility; each handler symbol is declared first
// with default visibility (GPCHOL_HANDLER_EXPORT), which its definition by
// XLA_FFI_DEFINE_HANDLER_SYMBOL keeps.

#define GPCHOL_HANDLER_EXPORT(name) \
  extern "C" __attribute__((visibility("default"))) XLA_FFI_Error* name(XLA_FFI_CallFrame*)

#define GPCHOL_POTRF_HANDLER(name, DT)                                                     \
  GPCHOL_HANDLER_EXPORT(name);                                                             \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(name, gpchol::cuda::potrf_impl<DT>,                        \
                                ffi::Ffi::Bind()                                           \
                                    .Ctx<ffi::PlatformStream<cudaStream_t>>()              \
                                    .Ctx<gpchol::cuda::XlaScratchCtx>()                    \
                                    .Ctx<ffi::DeviceOrdinal>()                             \
                                    .Attr<std::int64_t>("tile_size")                       \
                                    .Arg<ffi::Buffer<DT>>()                                \
                                    .Ret<ffi::Buffer<DT>>()                                \
                                    .Ret<ffi::Buffer<ffi::S32>>())

#define GPCHOL_ADJOINT_HANDLER(name, DT)                                                   \
  GPCHOL_HANDLER_EXPORT(name);                                                             \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(name, gpchol::cuda::adjoint_impl<DT>,                      \
                                ffi::Ffi::Bind()                                           \
                                    .Ctx<ffi::PlatformStream<cudaStream_t>>()              \
                                    .Ctx<gpchol::cuda::XlaScratchCtx>()                    \
                                    .Ctx<ffi::DeviceOrdinal>()                             \
                                    .Attr<std::int64_t>("tile_size")                       \
                                    .Arg<ffi::Buffer<DT>>()                                \
                                    .Arg<ffi::Buffer<DT>>()                                \
                                    .Ret<ffi::Buffer<DT>>())

#define GPCHOL_SMALL_POTRF_HANDLER(name, DT)                                               \
  GPCHOL_HANDLER_EXPORT(name);                                                             \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(name, gpchol::cuda::small_potrf_impl<DT>,                  \
                                ffi::Ffi::Bind()                                           \
                                    .Ctx<ffi::PlatformStream<cudaStream_t>>()              \
                                    .Ctx<gpchol::cuda::XlaScratchCtx>()                    \
                                    .Ctx<ffi::DeviceOrdinal>()                             \
                                    .Arg<ffi::Buffer<DT>>()                                \
                                    .Ret<ffi::Buffer<DT>>()                                \
                                    .Ret<ffi::Buffer<ffi::S32>>())

#define GPCHOL_SMALL_ADJOINT_HANDLER(name, DT)                                             \
  GPCHOL_HANDLER_EXPORT(name);                                                             \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(name, gpchol::cuda::small_adjoint_impl<DT>,                \
                                ffi::Ffi::Bind()                                           \
                                    .Ctx<ffi::PlatformStream<cudaStream_t>>()              \
                                    .Ctx<gpchol::cuda::XlaScratchCtx>()                    \
                                    .Ctx<ffi::DeviceOrdinal>()                             \
                                    .Arg<ffi::Buffer<DT>>()                                \
                                    .Arg<ffi::Buffer<DT>>()                                \
                                    .Ret<ffi::Buffer<DT>>())
