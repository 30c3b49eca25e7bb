// Per-device pools of cuBLAS/cuSOLVER handles (see HandleLease in cuda_backend.h).
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "cuda_backend.h"

namespace gpchol::cuda {
namespace {

std::mutex& pool_mutex() {
  static std::mutex m;
  return m;
}

// (device ordinal, stream) -> idle handle sets. Keyed by stream too, so that a handle (and
// the workspace cuBLAS keeps with it) only ever serves one stream and never runs
// concurrently with its own earlier work on another stream. Intentionally leaked (see
// HandleLease).
using PoolKey = std::pair<int, cudaStream_t>;
std::map<PoolKey, std::vector<Handles>>& pool() {
  static auto* p = new std::map<PoolKey, std::vector<Handles>>();
  return *p;
}

Status create_handles(int device, Handles* h) {
  DeviceGuard guard(device);
  GPCHOL_RETURN_IF_ERROR(guard.status());
  cublasStatus_t bs = cublasCreate(&h->blas);
  if (bs != CUBLAS_STATUS_SUCCESS) {
    return Status::Error("cublasCreate failed on device " + std::to_string(device) + ": " +
                         cublas_message(bs));
  }
  cusolverStatus_t ss = cusolverDnCreate(&h->solver);
  if (ss != CUSOLVER_STATUS_SUCCESS) {
    cublasDestroy(h->blas);
    return Status::Error("cusolverDnCreate failed on device " + std::to_string(device) + ": " +
                         cusolver_message(ss));
  }
  ss = cusolverDnCreateParams(&h->params);
  if (ss != CUSOLVER_STATUS_SUCCESS) {
    cusolverDnDestroy(h->solver);
    cublasDestroy(h->blas);
    return Status::Error("cusolverDnCreateParams failed: " + cusolver_message(ss));
  }
  return Status::Ok();
}

}  // namespace

std::string cublas_message(cublasStatus_t s) {
  return std::string(cublasGetStatusName(s)) + " (" + cublasGetStatusString(s) + ")";
}

std::string cusolver_message(cusolverStatus_t s) {
  switch (s) {
    case CUSOLVER_STATUS_SUCCESS: return "CUSOLVER_STATUS_SUCCESS";
    case CUSOLVER_STATUS_NOT_INITIALIZED: return "CUSOLVER_STATUS_NOT_INITIALIZED";
    case CUSOLVER_STATUS_ALLOC_FAILED: return "CUSOLVER_STATUS_ALLOC_FAILED";
    case CUSOLVER_STATUS_INVALID_VALUE: return "CUSOLVER_STATUS_INVALID_VALUE";
    case CUSOLVER_STATUS_ARCH_MISMATCH: return "CUSOLVER_STATUS_ARCH_MISMATCH";
    case CUSOLVER_STATUS_EXECUTION_FAILED: return "CUSOLVER_STATUS_EXECUTION_FAILED";
    case CUSOLVER_STATUS_INTERNAL_ERROR: return "CUSOLVER_STATUS_INTERNAL_ERROR";
    case CUSOLVER_STATUS_NOT_SUPPORTED: return "CUSOLVER_STATUS_NOT_SUPPORTED";
    case CUSOLVER_STATUS_INVALID_WORKSPACE: return "CUSOLVER_STATUS_INVALID_WORKSPACE";
    default: return "cusolverStatus_t " + std::to_string(static_cast<int>(s));
  }
}

DeviceGuard::DeviceGuard(int device) : device_(device) {
  cudaError_t e = cudaGetDevice(&previous_);
  if (e != cudaSuccess) {
    status_ = Status::Error(std::string("cudaGetDevice failed: ") + cudaGetErrorString(e));
    previous_ = -1;
    return;
  }
  if (previous_ != device_) {
    e = cudaSetDevice(device_);
    if (e != cudaSuccess) {
      status_ = Status::Error("cudaSetDevice(" + std::to_string(device_) +
                              ") failed: " + cudaGetErrorString(e));
    }
  }
}

DeviceGuard::~DeviceGuard() {
  if (previous_ >= 0 && previous_ != device_) cudaSetDevice(previous_);
}

Status HandleLease::acquire(int device, cudaStream_t stream) {
  Handles h;
  bool found = false;
  {
    std::lock_guard<std::mutex> lock(pool_mutex());
    auto& idle = pool()[PoolKey(device, stream)];
    if (!idle.empty()) {
      h = idle.back();
      idle.pop_back();
      found = true;
    }
  }
  if (!found) GPCHOL_RETURN_IF_ERROR(create_handles(device, &h));
  device_ = device;
  stream_ = stream;
  handles_ = h;
  held_ = true;
  cublasStatus_t bs = cublasSetStream(h.blas, stream);
  if (bs != CUBLAS_STATUS_SUCCESS) {
    return Status::Error("cublasSetStream failed: " + cublas_message(bs));
  }
  cusolverStatus_t ss = cusolverDnSetStream(h.solver, stream);
  if (ss != CUSOLVER_STATUS_SUCCESS) {
    return Status::Error("cusolverDnSetStream failed: " + cusolver_message(ss));
  }
  return Status::Ok();
}

HandleLease::~HandleLease() {
  if (!held_) return;
  std::lock_guard<std::mutex> lock(pool_mutex());
  pool()[PoolKey(device_, stream_)].push_back(handles_);
}

}  // namespace gpchol::cuda
