// CUDA backend of the host drivers in include/gpchol/algorithms.h: cuBLAS for the level-3
// updates, cuSOLVER for potrf, grid-stride kernels for the elementwise steps, and the
// shared-memory kernels of include/gpchol/small.h. All work is enqueued on the stream XLA
// hands to the FFI handler; nothing here synchronizes with the host.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cusolverDn.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gpchol/portability.h"
#include "gpchol/scratch.h"
#include "gpchol/small.h"
#include "xla/ffi/api/c_api.h"
#include "xla/ffi/api/ffi.h"

namespace gpchol::cuda {

// ---- scratch memory from XLA ----------------------------------------------------------

// Device memory from XLA's allocator for the duration of one FFI call, like
// ffi::ScratchAllocator, except that a failed allocation keeps XLA's own message (the
// ScratchAllocator only reports it to a diagnostic that nobody reads once the handler
// has been entered). Bound with `.Ctx<XlaScratchCtx>()`; freed when the handler returns.
class XlaScratch {
 public:
  XlaScratch(const XLA_FFI_Api* api, XLA_FFI_ExecutionContext* ctx) : api_(api), ctx_(ctx) {}
  XlaScratch(XlaScratch&& other) noexcept
      : api_(other.api_), ctx_(other.ctx_), blocks_(std::move(other.blocks_)) {
    other.blocks_.clear();
  }
  XlaScratch(const XlaScratch&) = delete;
  XlaScratch& operator=(const XlaScratch&) = delete;
  XlaScratch& operator=(XlaScratch&&) = delete;

  ~XlaScratch() {
    for (const Block& b : blocks_) {
      XLA_FFI_DeviceMemory_Free_Args args;
      args.struct_size = XLA_FFI_DeviceMemory_Free_Args_STRUCT_SIZE;
      args.extension_start = nullptr;
      args.ctx = ctx_;
      args.size = b.size;
      args.data = b.data;
      if (XLA_FFI_Error* e = api_->XLA_FFI_DeviceMemory_Free(&args)) take_message(e);
    }
  }

  // `bytes` at `alignment` (XLA accepts powers of two up to kXlaMaxScratchAlignment).
  Status allocate(size_t bytes, size_t alignment, void** ptr) {
    XLA_FFI_DeviceMemory_Allocate_Args args;
    args.struct_size = XLA_FFI_DeviceMemory_Allocate_Args_STRUCT_SIZE;
    args.extension_start = nullptr;
    args.ctx = ctx_;
    args.size = bytes;
    args.alignment = alignment;
    args.data = nullptr;
    if (XLA_FFI_Error* e = api_->XLA_FFI_DeviceMemory_Allocate(&args)) {
      return Status::Error("XLA: " + take_message(e));
    }
    blocks_.push_back({bytes, args.data});
    *ptr = args.data;
    return Status::Ok();
  }

 private:
  struct Block {
    size_t size;
    void* data;
  };

  // The error's message; the error is destroyed. FFI API 0.4 (jaxlib 0.11) replaced
  // XLA_FFI_Error_GetMessage by XLA_FFI_Error_GetDetails (message and code); the struct
  // holds `error` and `message` under the same names in both.
#if XLA_FFI_API_MAJOR > 0 || XLA_FFI_API_MINOR >= 4
  using MessageArgs = XLA_FFI_Error_GetDetails_Args;
  static constexpr size_t kMessageArgsSize = XLA_FFI_Error_GetDetails_Args_STRUCT_SIZE;
  static constexpr auto kGetMessage = &XLA_FFI_Api::XLA_FFI_Error_GetDetails;
#else
  using MessageArgs = XLA_FFI_Error_GetMessage_Args;
  static constexpr size_t kMessageArgsSize = XLA_FFI_Error_GetMessage_Args_STRUCT_SIZE;
  static constexpr auto kGetMessage = &XLA_FFI_Api::XLA_FFI_Error_GetMessage;
#endif
  std::string take_message(XLA_FFI_Error* e) const {
    MessageArgs get;
    get.struct_size = kMessageArgsSize;
    get.extension_start = nullptr;
    get.error = e;
    get.message = nullptr;
    (api_->*kGetMessage)(&get);
    std::string text = get.message != nullptr ? get.message : "(no message)";
    XLA_FFI_Error_Destroy_Args destroy;
    destroy.struct_size = XLA_FFI_Error_Destroy_Args_STRUCT_SIZE;
    destroy.extension_start = nullptr;
    destroy.error = e;
    api_->XLA_FFI_Error_Destroy(&destroy);
    return text;
  }

  const XLA_FFI_Api* api_;
  XLA_FFI_ExecutionContext* ctx_;
  std::vector<Block> blocks_;
};

// Context tag of XlaScratch in handler bindings.
struct XlaScratchCtx {};

}  // namespace gpchol::cuda

// (Both signatures of Decode: the FFI headers of older XLA versions pass no diagnostic.)
template <>
struct xla::ffi::CtxDecoding<gpchol::cuda::XlaScratchCtx> {
  using Type = gpchol::cuda::XlaScratch;
  static std::optional<Type> Decode(const XLA_FFI_Api* api, XLA_FFI_ExecutionContext* ctx,
                                    DiagnosticEngine&) {
    return Type(api, ctx);
  }
  static std::optional<Type> Decode(const XLA_FFI_Api* api, XLA_FFI_ExecutionContext* ctx) {
    return Type(api, ctx);
  }
};

namespace gpchol::cuda {

// ---- library handles ------------------------------------------------------------------

struct Handles {
  cublasHandle_t blas = nullptr;
  cusolverDnHandle_t solver = nullptr;
  cusolverDnParams_t params = nullptr;
};

// A set of handles borrowed from a per-(device, stream) pool and bound to that stream for
// the duration of one FFI call. Handles are not thread-safe, so each concurrent call gets its
// own set; sets are created on demand, reused afterwards and never destroyed (destroying
// library handles at process exit, after the CUDA runtime is gone, can crash).
class HandleLease {
 public:
  HandleLease() = default;
  HandleLease(const HandleLease&) = delete;
  HandleLease& operator=(const HandleLease&) = delete;
  ~HandleLease();
  // Borrows a set for `device` and binds it to `stream`.
  Status acquire(int device, cudaStream_t stream);
  bool held() const { return held_; }
  const Handles& handles() const { return handles_; }

 private:
  int device_ = -1;
  cudaStream_t stream_ = nullptr;
  bool held_ = false;
  Handles handles_;
};

// Makes `device` current for the lifetime of the guard (XLA normally already has it
// current on the calling thread; this is a cheap safety net).
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  Status status() const { return status_; }

 private:
  int previous_ = -1;
  int device_ = -1;
  Status status_;
};

std::string cublas_message(cublasStatus_t s);
std::string cusolver_message(cusolverStatus_t s);

// ---- kernels ---------------------------------------------------------------------------

// Threads per block of elementwise_kernel (also its __launch_bounds__).
constexpr int kElementwiseThreads = 256;

template <typename F>
__global__ void __launch_bounds__(kElementwiseThreads) elementwise_kernel(index_t count, F f) {
  const index_t stride = static_cast<index_t>(gridDim.x) * blockDim.x;
  for (index_t i = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    f(i);
  }
}

struct CudaBlock {
  template <typename F>
  __device__ __forceinline__ void for_each(int count, F&& f) {
    for (int i = threadIdx.x; i < count; i += blockDim.x) f(i);
    __syncthreads();
  }
};

// Launched with small_threads(n) <= small_max_threads<T>() threads (n <= small_max_n<T>(),
// checked by the handlers), the bound that caps its registers per thread.
template <typename T>
__global__ void __launch_bounds__(small_max_threads<T>())
    small_potrf_kernel(const T* a, T* out, std::int32_t* status, int n) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sm = reinterpret_cast<T*>(smem_raw);
  const index_t off = static_cast<index_t>(blockIdx.x) * n * n;
  CudaBlock blk;
  small_potrf_body<T>(blk, a + off, out + off, status + blockIdx.x, n, sm);
}

template <typename T>
__global__ void __launch_bounds__(small_max_threads<T>())
    small_adjoint_kernel(const T* L, const T* lbar, T* g, int n) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sm = reinterpret_cast<T*>(smem_raw);
  const index_t off = static_cast<index_t>(blockIdx.x) * n * n;
  CudaBlock blk;
  small_adjoint_body<T>(blk, L + off, lbar + off, g + off, n, sm);
}

// ---- typed cuBLAS entry points ------------------------------------------------------

inline cublasSideMode_t to_cublas(Side s) {
  return s == Side::kLeft ? CUBLAS_SIDE_LEFT : CUBLAS_SIDE_RIGHT;
}
inline cublasFillMode_t to_cublas(Uplo u) {
  return u == Uplo::kLower ? CUBLAS_FILL_MODE_LOWER : CUBLAS_FILL_MODE_UPPER;
}
inline cublasOperation_t to_cublas(Op o) { return o == Op::kN ? CUBLAS_OP_N : CUBLAS_OP_T; }

#define GPCHOL_CUBLAS_OVERLOADS(T, P)                                                          \
  inline cublasStatus_t blas_trsm(cublasHandle_t h, cublasSideMode_t s, cublasFillMode_t u,    \
                                  cublasOperation_t o, int m, int n, const T* alpha,           \
                                  const T* a, int lda, T* b, int ldb) {                        \
    return cublas##P##trsm(h, s, u, o, CUBLAS_DIAG_NON_UNIT, m, n, alpha, a, lda, b, ldb);     \
  }                                                                                            \
  inline cublasStatus_t blas_trmm(cublasHandle_t h, cublasSideMode_t s, cublasFillMode_t u,    \
                                  cublasOperation_t o, int m, int n, const T* alpha,           \
                                  const T* a, int lda, T* b, int ldb) {                        \
    return cublas##P##trmm(h, s, u, o, CUBLAS_DIAG_NON_UNIT, m, n, alpha, a, lda, b, ldb, b,   \
                           ldb);                                                               \
  }                                                                                            \
  inline cublasStatus_t blas_gemm(cublasHandle_t h, cublasOperation_t oa, cublasOperation_t ob, \
                                  int m, int n, int k, const T* alpha, const T* a, int lda,    \
                                  const T* b, int ldb, const T* beta, T* c, int ldc) {         \
    return cublas##P##gemm(h, oa, ob, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);           \
  }                                                                                            \
  inline cublasStatus_t blas_syrk(cublasHandle_t h, cublasFillMode_t u, cublasOperation_t o,   \
                                  int n, int k, const T* alpha, const T* a, int lda,           \
                                  const T* beta, T* c, int ldc) {                              \
    return cublas##P##syrk(h, u, o, n, k, alpha, a, lda, beta, c, ldc);                        \
  }

GPCHOL_CUBLAS_OVERLOADS(float, S)
GPCHOL_CUBLAS_OVERLOADS(double, D)
#undef GPCHOL_CUBLAS_OVERLOADS

template <typename T>
constexpr cudaDataType cuda_type() {
  return sizeof(T) == 8 ? CUDA_R_64F : CUDA_R_32F;
}

// ---- the backend ------------------------------------------------------------------------

class CudaBackend {
 public:
  // Library handles are borrowed on first use (the small-matrix kernels need none unless a
  // batch falls back to the large path).
  CudaBackend(cudaStream_t stream, int device, XlaScratch& scratch)
      : stream_(stream), device_(device), scratch_(scratch) {}

  Status scratch(size_t bytes, void** ptr) { return aligned_scratch(scratch_, bytes, ptr); }

  // Dynamic shared memory one thread block may use (the opt-in maximum; at least 48 KiB).
  Status shared_memory_limit(index_t* bytes) {
    int max_optin = 0;
    GPCHOL_RETURN_IF_ERROR(check_cuda(
        cudaDeviceGetAttribute(&max_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device_),
        "cudaDeviceGetAttribute(cudaDevAttrMaxSharedMemoryPerBlockOptin)"));
    *bytes = std::max<index_t>(max_optin, 48 * 1024);
    return Status::Ok();
  }

  Status copy(void* dst, const void* src, size_t bytes) {
    return check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_),
                      "cudaMemcpyAsync");
  }

  Status zero(void* dst, size_t bytes) {
    return check_cuda(cudaMemsetAsync(dst, 0, bytes, stream_), "cudaMemsetAsync");
  }

  template <typename F>
  Status for_each(index_t count, const F& f) {
    if (count <= 0) return Status::Ok();
    constexpr int kThreads = kElementwiseThreads;
    const index_t blocks = std::min<index_t>((count + kThreads - 1) / kThreads, index_t(1) << 20);
    elementwise_kernel<F><<<static_cast<unsigned>(blocks), kThreads, 0, stream_>>>(count, f);
    return check_cuda(cudaGetLastError(), "elementwise kernel launch");
  }

  // Column-major upper / lower Cholesky through cuSOLVER's 64-bit API. `info` is device
  // memory.
  template <typename T>
  Status potrf_upper(index_t n, T* a, index_t lda, std::int32_t* info) {
    return potrf_fill<T>(CUBLAS_FILL_MODE_UPPER, n, a, lda, info);
  }
  template <typename T>
  Status potrf_lower(index_t n, T* a, index_t lda, std::int32_t* info) {
    return potrf_fill<T>(CUBLAS_FILL_MODE_LOWER, n, a, lda, info);
  }

  template <typename T>
  Status potrf_fill(cublasFillMode_t fill, index_t n, T* a, index_t lda, std::int32_t* info) {
    const Handles* h = nullptr;
    GPCHOL_RETURN_IF_ERROR(handles(&h));
    size_t dev_bytes = 0, host_bytes = 0;
    if (n != ws_n_ || sizeof(T) != ws_itemsize_ || fill != ws_fill_) {
      cusolverStatus_t s = cusolverDnXpotrf_bufferSize(h->solver, h->params, fill, n,
                                                       cuda_type<T>(), a, lda, cuda_type<T>(),
                                                       &dev_bytes, &host_bytes);
      if (s != CUSOLVER_STATUS_SUCCESS) {
        return Status::Error("cusolverDnXpotrf_bufferSize failed: " + cusolver_message(s));
      }
      if (dev_bytes > ws_dev_bytes_) {
        GPCHOL_RETURN_IF_ERROR(scratch(dev_bytes, &ws_dev_));
        ws_dev_bytes_ = dev_bytes;
      }
      if (host_bytes > ws_host_.size()) ws_host_.resize(host_bytes);
      ws_n_ = n;
      ws_itemsize_ = sizeof(T);
      ws_fill_ = fill;
      ws_dev_need_ = dev_bytes;
      ws_host_need_ = host_bytes;
    }
    cusolverStatus_t s = cusolverDnXpotrf(
        h->solver, h->params, fill, n, cuda_type<T>(), a, lda, cuda_type<T>(), ws_dev_,
        ws_dev_need_, ws_host_need_ > 0 ? ws_host_.data() : nullptr, ws_host_need_,
        reinterpret_cast<int*>(info));
    if (s != CUSOLVER_STATUS_SUCCESS) {
      return Status::Error("cusolverDnXpotrf failed: " + cusolver_message(s));
    }
    // The host workspace (normally none for potrf) belongs to this backend object, which
    // dies when the handler returns: cuSOLVER's queued work must be done with it first.
    if (ws_host_need_ > 0) {
      GPCHOL_RETURN_IF_ERROR(check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"));
    }
    return Status::Ok();
  }

  template <typename T>
  Status trsm(Side side, Uplo uplo, Op op, index_t m, index_t n, T alpha, const T* a,
              index_t lda, T* b, index_t ldb) {
    GPCHOL_RETURN_IF_ERROR(fits_int({m, n, lda, ldb}, "trsm"));
    const Handles* h = nullptr;
    GPCHOL_RETURN_IF_ERROR(handles(&h));
    return check_blas(blas_trsm(h->blas, to_cublas(side), to_cublas(uplo), to_cublas(op),
                                int(m), int(n), &alpha, a, int(lda), b, int(ldb)),
                      "trsm");
  }

  template <typename T>
  Status trmm(Side side, Uplo uplo, Op op, index_t m, index_t n, T alpha, const T* a,
              index_t lda, T* b, index_t ldb) {
    GPCHOL_RETURN_IF_ERROR(fits_int({m, n, lda, ldb}, "trmm"));
    const Handles* h = nullptr;
    GPCHOL_RETURN_IF_ERROR(handles(&h));
    return check_blas(blas_trmm(h->blas, to_cublas(side), to_cublas(uplo), to_cublas(op),
                                int(m), int(n), &alpha, a, int(lda), b, int(ldb)),
                      "trmm");
  }

  template <typename T>
  Status gemm(Op opa, Op opb, index_t m, index_t n, index_t k, T alpha, const T* a,
              index_t lda, const T* b, index_t ldb, T beta, T* c, index_t ldc) {
    GPCHOL_RETURN_IF_ERROR(fits_int({m, n, k, lda, ldb, ldc}, "gemm"));
    const Handles* h = nullptr;
    GPCHOL_RETURN_IF_ERROR(handles(&h));
    return check_blas(blas_gemm(h->blas, to_cublas(opa), to_cublas(opb), int(m), int(n), int(k),
                                &alpha, a, int(lda), b, int(ldb), &beta, c, int(ldc)),
                      "gemm");
  }

  template <typename T>
  Status syrk(Uplo uplo, Op op, index_t n, index_t k, T alpha, const T* a, index_t lda, T beta,
              T* c, index_t ldc) {
    GPCHOL_RETURN_IF_ERROR(fits_int({n, k, lda, ldc}, "syrk"));
    const Handles* h = nullptr;
    GPCHOL_RETURN_IF_ERROR(handles(&h));
    return check_blas(blas_syrk(h->blas, to_cublas(uplo), to_cublas(op), int(n), int(k), &alpha,
                                a, int(lda), &beta, c, int(ldc)),
                      "syrk");
  }

  template <typename T>
  Status small_potrf(const T* a, T* out, std::int32_t* status, index_t batch, int n) {
    if (batch == 0) return Status::Ok();
    if (n == 0) return zero(status, sizeof(std::int32_t) * batch);
    const size_t smem = static_cast<size_t>(small_potrf_smem<T>(n));
    GPCHOL_RETURN_IF_ERROR(allow_smem(reinterpret_cast<const void*>(&small_potrf_kernel<T>), smem));
    GPCHOL_RETURN_IF_ERROR(check_grid(batch));
    small_potrf_kernel<T><<<static_cast<unsigned>(batch), small_threads(n), smem, stream_>>>(
        a, out, status, n);
    return check_cuda(cudaGetLastError(), "small potrf kernel launch");
  }

  template <typename T>
  Status small_adjoint(const T* L, const T* lbar, T* g, index_t batch, int n) {
    if (batch == 0 || n == 0) return Status::Ok();
    const size_t smem = static_cast<size_t>(small_adjoint_smem<T>(n));
    GPCHOL_RETURN_IF_ERROR(
        allow_smem(reinterpret_cast<const void*>(&small_adjoint_kernel<T>), smem));
    GPCHOL_RETURN_IF_ERROR(check_grid(batch));
    small_adjoint_kernel<T><<<static_cast<unsigned>(batch), small_threads(n), smem, stream_>>>(
        L, lbar, g, n);
    return check_cuda(cudaGetLastError(), "small adjoint kernel launch");
  }

 private:
  // The cuBLAS/cuSOLVER handles of this call, borrowed from the pool on first use.
  Status handles(const Handles** h) {
    if (!lease_.held()) GPCHOL_RETURN_IF_ERROR(lease_.acquire(device_, stream_));
    *h = &lease_.handles();
    return Status::Ok();
  }

  static Status check_cuda(cudaError_t e, const char* what) {
    if (e == cudaSuccess) return Status::Ok();
    return Status::Error(std::string(what) + " failed: " + cudaGetErrorName(e) + " (" +
                         cudaGetErrorString(e) + ")");
  }

  static Status check_blas(cublasStatus_t s, const char* what) {
    if (s == CUBLAS_STATUS_SUCCESS) return Status::Ok();
    return Status::Error(std::string("cuBLAS ") + what + " failed: " + cublas_message(s));
  }

  static Status fits_int(std::initializer_list<index_t> values, const char* what) {
    for (index_t v : values) {
      if (v < 0 || v > INT_MAX) {
        return Status::Error(std::string(what) + ": dimension " + std::to_string(v) +
                             " does not fit cuBLAS's 32-bit interface");
      }
    }
    return Status::Ok();
  }

  static Status check_grid(index_t batch) {
    if (batch > INT_MAX) {
      return Status::Error("batch of " + std::to_string(batch) +
                           " matrices exceeds the grid limit of the small kernels");
    }
    return Status::Ok();
  }

  // Kernels using more than 48 KiB of dynamic shared memory must opt in. Dispatch
  // (potrf_small_batch) has already checked `bytes` against shared_memory_limit.
  Status allow_smem(const void* kernel, size_t bytes) {
    if (bytes <= 48 * 1024) return Status::Ok();
    index_t limit = 0;
    GPCHOL_RETURN_IF_ERROR(shared_memory_limit(&limit));
    if (bytes > static_cast<size_t>(limit)) {
      return Status::Error("the small-matrix kernel needs " + std::to_string(bytes) +
                           " bytes of shared memory per block; this device allows " +
                           std::to_string(limit));
    }
    // The limit is per kernel and process-wide: raise it to the device's maximum (not to
    // this call's size), so that a concurrent call for a smaller n can never lower it
    // between another thread's opt-in and its launch.
    return check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(limit)),
                      "cudaFuncSetAttribute");
  }

  cudaStream_t stream_;
  int device_;
  XlaScratch& scratch_;
  HandleLease lease_;
  // cuSOLVER potrf workspace, sized for the last (n, dtype) queried; grown, never shrunk.
  index_t ws_n_ = -1;
  size_t ws_itemsize_ = 0;
  cublasFillMode_t ws_fill_ = CUBLAS_FILL_MODE_UPPER;
  void* ws_dev_ = nullptr;
  size_t ws_dev_bytes_ = 0;
  size_t ws_dev_need_ = 0;
  size_t ws_host_need_ = 0;
  std::vector<unsigned char> ws_host_;
};

}  // namespace gpchol::cuda
