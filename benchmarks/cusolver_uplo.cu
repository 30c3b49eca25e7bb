// cuSOLVER's potrf, UPPER against LOWER fill, on the GPU it runs on: which variant should
// gpchol's untiled forward (kernels_cuda/include/gpchol/algorithms.h) call?
//
//   nvcc -O2 -arch=sm_90 benchmarks/cusolver_uplo.cu -I<nvidia/cu13/include> \
//        -L<nvidia/cu13/lib> -lcusolver -lcublas -Xlinker -rpath=<nvidia/cu13/lib> -o uplo
//   ./uplo [n ...]            (default 4096 8192 16384)
//
// For each n and dtype: a diagonally dominant SPD matrix A_ij = 1 / (1 + |i - j|) + n [i = j]
// (no zeros, condition number about 1), restored from a pristine copy before every call;
// cusolverDnXpotrf timed with CUDA events around the call alone, 2 warm-ups, median of 7.
// Prints one line per (dtype, n): both times in ms, UPPER / LOWER, and both infos.
#include <cuda_runtime.h>
#include <cusolverDn.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CHECK_CUDA(x)                                                              \
  do {                                                                             \
    cudaError_t e_ = (x);                                                          \
    if (e_ != cudaSuccess) {                                                       \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x,               \
                   cudaGetErrorString(e_));                                        \
      std::exit(1);                                                                \
    }                                                                              \
  } while (0)
#define CHECK_SOLVER(x)                                                            \
  do {                                                                             \
    cusolverStatus_t s_ = (x);                                                     \
    if (s_ != CUSOLVER_STATUS_SUCCESS) {                                           \
      std::fprintf(stderr, "%s:%d %s: status %d\n", __FILE__, __LINE__, #x, int(s_)); \
      std::exit(1);                                                                \
    }                                                                              \
  } while (0)

template <typename T>
__global__ void fill_spd(T* a, long n) {
  const long count = n * n;
  for (long idx = blockIdx.x * long(blockDim.x) + threadIdx.x; idx < count;
       idx += long(gridDim.x) * blockDim.x) {
    const long i = idx / n, j = idx % n;
    const long d = i > j ? i - j : j - i;
    a[idx] = T(1) / T(1 + d) + (i == j ? T(n) : T(0));
  }
}

template <typename T>
cudaDataType type_of();
template <>
cudaDataType type_of<float>() { return CUDA_R_32F; }
template <>
cudaDataType type_of<double>() { return CUDA_R_64F; }

template <typename T>
float time_potrf(cusolverDnHandle_t h, cusolverDnParams_t p, cublasFillMode_t fill, long n,
                 const T* pristine, T* a, int* info_dev, int* info_host) {
  size_t dev_bytes = 0, host_bytes = 0;
  CHECK_SOLVER(cusolverDnXpotrf_bufferSize(h, p, fill, n, type_of<T>(), a, n, type_of<T>(),
                                           &dev_bytes, &host_bytes));
  void* work = nullptr;
  CHECK_CUDA(cudaMalloc(&work, std::max<size_t>(dev_bytes, 1)));
  std::vector<unsigned char> host(std::max<size_t>(host_bytes, 1));
  cudaEvent_t t0, t1;
  CHECK_CUDA(cudaEventCreate(&t0));
  CHECK_CUDA(cudaEventCreate(&t1));
  std::vector<float> ms;
  for (int rep = 0; rep < 9; ++rep) {
    CHECK_CUDA(cudaMemcpy(a, pristine, sizeof(T) * n * n, cudaMemcpyDeviceToDevice));
    CHECK_CUDA(cudaDeviceSynchronize());
    CHECK_CUDA(cudaEventRecord(t0));
    CHECK_SOLVER(cusolverDnXpotrf(h, p, fill, n, type_of<T>(), a, n, type_of<T>(), work,
                                  dev_bytes, host.data(), host_bytes, info_dev));
    CHECK_CUDA(cudaEventRecord(t1));
    CHECK_CUDA(cudaEventSynchronize(t1));
    float t = 0;
    CHECK_CUDA(cudaEventElapsedTime(&t, t0, t1));
    if (rep >= 2) ms.push_back(t);
  }
  CHECK_CUDA(cudaMemcpy(info_host, info_dev, sizeof(int), cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaFree(work));
  CHECK_CUDA(cudaEventDestroy(t0));
  CHECK_CUDA(cudaEventDestroy(t1));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

template <typename T>
void run(cusolverDnHandle_t h, cusolverDnParams_t p, long n, const char* name) {
  T *pristine = nullptr, *a = nullptr;
  int* info_dev = nullptr;
  CHECK_CUDA(cudaMalloc(&pristine, sizeof(T) * n * n));
  CHECK_CUDA(cudaMalloc(&a, sizeof(T) * n * n));
  CHECK_CUDA(cudaMalloc(&info_dev, sizeof(int)));
  fill_spd<T><<<4096, 256>>>(pristine, n);
  CHECK_CUDA(cudaGetLastError());
  int info_up = -1, info_lo = -1;
  const float up = time_potrf<T>(h, p, CUBLAS_FILL_MODE_UPPER, n, pristine, a, info_dev, &info_up);
  const float lo = time_potrf<T>(h, p, CUBLAS_FILL_MODE_LOWER, n, pristine, a, info_dev, &info_lo);
  std::printf("%-7s n=%6ld  upper %9.3f ms  lower %9.3f ms  upper/lower %5.2f  info %d %d\n",
              name, n, up, lo, up / lo, info_up, info_lo);
  std::fflush(stdout);
  CHECK_CUDA(cudaFree(pristine));
  CHECK_CUDA(cudaFree(a));
  CHECK_CUDA(cudaFree(info_dev));
}

int main(int argc, char** argv) {
  std::vector<long> sizes;
  for (int i = 1; i < argc; ++i) sizes.push_back(std::atol(argv[i]));
  if (sizes.empty()) sizes = {4096, 8192, 16384};
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  int version = 0;
  CHECK_SOLVER(cusolverGetVersion(&version));
  std::printf("device %s, cuSOLVER %d; cusolverDnXpotrf, median of 7 after 2 warm-ups\n",
              prop.name, version);
  cusolverDnHandle_t h;
  cusolverDnParams_t p;
  CHECK_SOLVER(cusolverDnCreate(&h));
  CHECK_SOLVER(cusolverDnCreateParams(&p));
  for (long n : sizes) {
    run<double>(h, p, n, "float64");
    run<float>(h, p, n, "float32");
  }
  return 0;
}
