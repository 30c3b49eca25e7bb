// Plain C queries used by gpchol._cuda.ffi (through ctypes) to check the library against
// the driver and to report versions and limits.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cusolverDn.h>

#include "gpchol/scratch.h"
#include "gpchol/small.h"

// ---- version queries (ctypes, for gpchol._cuda.ffi's availability check and reports) ----

#define GPCHOL_EXPORT extern "C" __attribute__((visibility("default")))

// CUDA runtime version the library was compiled against (e.g. 13000).
GPCHOL_EXPORT int gpchol_cuda_runtime_version() { return CUDART_VERSION; }

// Newest CUDA version the installed driver supports (0: no driver; -1: query failed).
GPCHOL_EXPORT int gpchol_cuda_driver_version() {
  int v = 0;
  return cudaDriverGetVersion(&v) == cudaSuccess ? v : -1;
}

// cuBLAS / cuSOLVER versions compiled against, as major * 10000 + minor * 100 + patch.
GPCHOL_EXPORT int gpchol_cublas_header_version() { return CUBLAS_VERSION; }
GPCHOL_EXPORT int gpchol_cusolver_header_version() {
  return CUSOLVER_VER_MAJOR * 10000 + CUSOLVER_VER_MINOR * 100 + CUSOLVER_VER_PATCH;
}

// cuBLAS / cuSOLVER versions actually loaded, same encoding (-1 on failure).
GPCHOL_EXPORT int gpchol_cublas_loaded_version() {
  int ma = 0, mi = 0, pa = 0;
  if (cublasGetProperty(MAJOR_VERSION, &ma) != CUBLAS_STATUS_SUCCESS ||
      cublasGetProperty(MINOR_VERSION, &mi) != CUBLAS_STATUS_SUCCESS ||
      cublasGetProperty(PATCH_LEVEL, &pa) != CUBLAS_STATUS_SUCCESS) {
    return -1;
  }
  return ma * 10000 + mi * 100 + pa;
}
GPCHOL_EXPORT int gpchol_cusolver_loaded_version() {
  int ma = 0, mi = 0, pa = 0;
  if (cusolverGetProperty(MAJOR_VERSION, &ma) != CUSOLVER_STATUS_SUCCESS ||
      cusolverGetProperty(MINOR_VERSION, &mi) != CUSOLVER_STATUS_SUCCESS ||
      cusolverGetProperty(PATCH_LEVEL, &pa) != CUSOLVER_STATUS_SUCCESS) {
    return -1;
  }
  return ma * 10000 + mi * 100 + pa;
}

// Largest n handled by the small-matrix kernels for an element size of 4 or 8 bytes.
GPCHOL_EXPORT int gpchol_small_max_n(int itemsize) {
  return itemsize == 8 ? gpchol::kSmallMaxF64 : gpchol::kSmallMaxF32;
}

// Shared memory (bytes) the small-matrix kernel needs for one n x n matrix (adjoint != 0:
// the adjoint kernel), for an element size of 4 or 8 bytes.
GPCHOL_EXPORT long long gpchol_small_smem_bytes(int itemsize, int n, int adjoint) {
  if (itemsize == 8) {
    return adjoint ? gpchol::small_adjoint_smem<double>(n) : gpchol::small_potrf_smem<double>(n);
  }
  return adjoint ? gpchol::small_adjoint_smem<float>(n) : gpchol::small_potrf_smem<float>(n);
}

// Dynamic shared memory per block a kernel may opt in to on `device` (-1: query failed).
GPCHOL_EXPORT int gpchol_device_smem_optin(int device) {
  int v = 0;
  return cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) ==
                 cudaSuccess
             ? v
             : -1;
}

// Alignment the kernels ask XLA's scratch allocator for (XLA accepts at most 16).
GPCHOL_EXPORT int gpchol_scratch_request_alignment() {
  return static_cast<int>(gpchol::kScratchRequestAlignment);
}
