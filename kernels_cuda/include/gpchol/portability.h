// Helpers shared by the CUDA build and the CPU emulation build of the kernels.
//
// Everything under include/gpchol/ compiles both with nvcc (device code) and with a plain
// C++17 compiler (the CPU emulation in ../emulation, used by the tests on machines without
// a GPU). Functions meant for both sides are marked GPCHOL_HD.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>

#if defined(__CUDACC__)
#define GPCHOL_HD __host__ __device__ __forceinline__
#else
#define GPCHOL_HD inline
#endif

namespace gpchol {

using index_t = std::int64_t;

// Largest int32 value, used as "no failure seen yet" while scanning for failed pivots.
constexpr std::int32_t kNoFailure = 2147483647;

GPCHOL_HD double sqrt_(double x) { return sqrt(x); }
GPCHOL_HD float sqrt_(float x) { return sqrtf(x); }

template <typename T>
GPCHOL_HD T nan_() {
  return static_cast<T>(NAN);
}

// A pivot is acceptable when it is positive, NaN excluded: reference LAPACK's test
// (dpotrf2: "ajj <= 0 or NaN" fails), which defines every backend's status
// (gpchol/_linalg/status.py). An infinite pivot is positive: the factorization goes on
// (the column under it is 0), as on the CPU.
template <typename T>
GPCHOL_HD bool good_pivot(T d) {
  return d > T(0);  // false for NaN
}

// *p = min(*p, v), atomically on the device; a plain min in the (sequential) emulation.
GPCHOL_HD void atomic_min_i32(std::int32_t* p, std::int32_t v) {
#if defined(__CUDA_ARCH__)
  atomicMin(reinterpret_cast<int*>(p), static_cast<int>(v));
#else
  if (v < *p) *p = v;
#endif
}

// Leading dimension of a small matrix held in shared memory: odd, so that walking down a
// column (stride ld) touches distinct banks for 4-byte and for 8-byte elements.
GPCHOL_HD int small_ld(int n) { return (n % 2 == 0) ? n + 1 : n; }

// Result of a host-side step: ok, or a message for the caller (turned into an ffi::Error
// by the FFI handlers, into a return code by the emulation).
class Status {
 public:
  Status() = default;
  static Status Ok() { return Status(); }
  static Status Error(std::string message) {
    Status s;
    s.ok_ = false;
    s.message_ = std::move(message);
    return s;
  }
  bool ok() const { return ok_; }
  const std::string& message() const { return message_; }

 private:
  bool ok_ = true;
  std::string message_;
};

#define GPCHOL_RETURN_IF_ERROR(expr)        \
  do {                                      \
    ::gpchol::Status _gpchol_s = (expr);    \
    if (!_gpchol_s.ok()) return _gpchol_s;  \
  } while (0)

// BLAS-style flags, in cuBLAS's column-major convention. The host algorithms
// (algorithms.h) are written against these; each backend maps them to its library.
enum class Side { kLeft, kRight };
enum class Uplo { kLower, kUpper };
enum class Op { kN, kT };

}  // namespace gpchol
