// gpchol's CPU handlers: LAPACK on XLA's buffers, as compiled XLA FFI custom calls.
//
// Three operations run on every step of a Gaussian-process fit on the CPU, or whenever a
// factorization fails; they used to be Python callbacks (jax.pure_callback /
// buffer_callback), which take the GIL inside XLA's runtime, can deadlock it (seen with
// XLA_FLAGS=--xla_cpu_multi_thread_eigen=false under vmap) and turn Ctrl-C into an
// internal error. Here they are plain C++ called by XLA, never touching Python:
//
//   gpchol_cpu_chol_solve_{f32,f64}   K (..., n, n), r (..., n), column_major, symmetric ->
//       L (aliased to K: factored in place), alpha = K^-1 r, quad = r^T K^-1 r,
//       logdet = log det K, status (LAPACK potrf's info).
//   gpchol_cpu_potri_{f32,f64}        factor (..., n, n) -> A^-1, in place (aliased).
//   gpchol_cpu_potrf_info_{f32,f64}   a (..., n, n), mask (...) -> LAPACK potrf's info for
//       each masked matrix (0 for the others, which are not read): the status search.
//   gpchol_cpu_trsm_{f32,f64}         a (..., k, k) or (k, k), b (..., m, p), left, lower,
//       transpose -> the solution of op(a) x = b (left) or x op(a) = b, in b's buffer;
//       both column-major, as jaxlib's own triangular solve declares them.
//
// Batch dimensions are looped over here, so vmap adds no per-element call.
//
// Layout. XLA hands the buffers row-major. The row-major n x n matrix M is, read as a
// column-major (Fortran) matrix with leading dimension n, its transpose M^T. LAPACK's
// potrf is called exactly as XLA's own CPU Cholesky and scipy.linalg.lapack.?potrf(a,
// lower=1) call it: uplo 'L' on the column-major matrix. (Its 'U' path is the same
// arithmetic in another order, and near a failing pivot it can report another `info`:
// 143 of 600 rank-deficient test matrices differ between the two.) So the row-major lower
// triangle is first mirrored onto the upper one (O(n^2), in place), potrf('L') then leaves
// L in the column-major lower triangle, i.e. L^T in the row-major upper one, which one
// more O(n^2) pass moves to the row-major lower triangle, zeroing the rest. With the
// `column_major` attribute the call declares K and L column-major instead (as jaxlib does
// for its own potrf), XLA writes K that way (usually straight from the fusion that builds
// it) and potrf('L') runs on it as it is: neither pass (about 5% of a likelihood step at
// n = 4000). The GP likelihood uses that form (K built inside it, never kept); its factor
// then goes to potri column-major. Where K is kept row-major elsewhere (a covariance the
// caller built, needed again by its derivative) the row-major form is cheaper, and with
// the `symmetric` attribute (K = (A + A^T)/2, equal triangles bit for bit) the first pass
// is skipped.
//
// LAPACK itself is the one SciPy ships (jaxlib's own CPU kernels use the same one): the
// function pointers come from scipy.linalg.cython_lapack / cython_blas and are handed to
// gpchol_cpu_set_lapack once, by gpchol._cpu.ffi, before any handler runs. So this
// library links against no BLAS, and its status is by construction the same `info` as
// scipy.linalg.lapack.?potrf and XLA's own Cholesky.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

#define GPCHOL_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

// Fortran LAPACK/BLAS signatures as SciPy's Cython modules export them (LP64 int).
template <typename T>
using PotrfFn = void(char* uplo, int* n, T* a, int* lda, int* info);
template <typename T>
using TrsvFn = void(char* uplo, char* trans, char* diag, int* n, T* a, int* lda, T* x,
                    int* incx);

// BLAS-3 and LAPACK routines of the split (recursive) factor and inverse below.
template <typename T>
using TrsmFn = void(char* side, char* uplo, char* transa, char* diag, int* m, int* n,
                    T* alpha, T* a, int* lda, T* b, int* ldb);  // trmm has the same
template <typename T>
using SyrkFn = void(char* uplo, char* trans, int* n, int* k, T* alpha, T* a, int* lda,
                    T* beta, T* c, int* ldc);
template <typename T>
using GemmFn = void(char* transa, char* transb, int* m, int* n, int* k, T* alpha, T* a,
                    int* lda, T* b, int* ldb, T* beta, T* c, int* ldc);
template <typename T>
using TrtriFn = void(char* uplo, char* diag, int* n, T* a, int* lda, int* info);
template <typename T>
using LauumFn = void(char* uplo, int* n, T* a, int* lda, int* info);

template <typename T>
struct Blas3 {
  TrsmFn<T>* trsm = nullptr;
  TrsmFn<T>* trmm = nullptr;
  SyrkFn<T>* syrk = nullptr;
  GemmFn<T>* gemm = nullptr;
  TrtriFn<T>* trtri = nullptr;
  LauumFn<T>* lauum = nullptr;
  bool ready() const { return trsm && trmm && syrk && gemm && trtri && lauum; }
};

struct Lapack {
  Blas3<float> s3;
  Blas3<double> d3;
  PotrfFn<float>* spotrf = nullptr;
  PotrfFn<double>* dpotrf = nullptr;
  PotrfFn<float>* spotri = nullptr;
  PotrfFn<double>* dpotri = nullptr;
  TrsvFn<float>* strsv = nullptr;
  TrsvFn<double>* dtrsv = nullptr;
};

// Set once by gpchol_cpu_set_lapack (under gpchol._cpu.ffi's lock, before the handlers are
// registered with XLA) and only read afterwards.
Lapack g_lapack;

// OpenBLAS's thread count (SciPy's OpenBLAS), when gpchol._cpu.ffi found its functions.
struct Threads {
  int (*get)() = nullptr;
  void (*set)(int) = nullptr;
};
Threads g_threads;

// SciPy 1.17.1's OpenBLAS 0.3.30 (2 threads, AMD EPYC) segfaults in its threaded dsyrk
// from an output order of about 23,000 on (22,000 completes; k = 256), and so in its
// threaded dpotrf, which calls it (n = 23,100 and 23,200 crash; 20,000 and 21,500
// complete). Plain scipy.linalg.blas.dsyrk and lapack.dpotrf reproduce it; with
// OPENBLAS_NUM_THREADS=1 both complete. On another machine of this project (2026-11-30)
// the threaded dpotrf crashed from n = 16,000 on (11,314 completed). Its threaded dgemm
// (32,000 x 32,000 x 128), dtrsm, dtrmm (order 24,000), dtrtri and dlauum (23,500) complete
// here. So above the order the caller gives (`split_above`; gpchol._cpu.ffi's default is
// 8192) the factor and the inverse are computed by halving (SplitPotrf, SplitTrtri,
// SplitLauum below): potrf, syrk, trtri and lauum are then only called on orders up to that
// bound, gemm, trsm and trmm on larger blocks, all on OpenBLAS's threads (as fast as one
// potrf/potri call at n = 12,000 and 16,000; 1.9-2.0x faster than one call on one thread
// at 24,000). Without those routines (another LAPACK), potrf and potri instead run whole,
// on one OpenBLAS thread there: slower (on 2 cores at most 2x), but a crash loses the
// whole process and the fit in it.

// Up to this order the factor and the inverse run on one OpenBLAS thread: its threaded
// potrf and lauum are slower there than one thread, and the pool they wake then spins,
// taking a core from XLA's own work for the rest of the step (see kSmallInverseMaxN).
// Whole GP steps are faster this way up to about this order and no slower above it
// (benchmarks/results/design-measurements.md).
constexpr int64_t kOneThreadMaxN = 512;

// While alive: OpenBLAS on one thread when `one` (restored afterwards). This changes the
// library's process-wide thread count for the duration of the call, so a concurrent
// OpenBLAS call elsewhere may run on one thread meanwhile (slower, never wrong).
class OneThread {
 public:
  explicit OneThread(bool one) {
    if (one && g_threads.get != nullptr && g_threads.set != nullptr) {
      saved_ = g_threads.get();
      if (saved_ > 1) g_threads.set(1);
    }
  }
  ~OneThread() {
    if (saved_ > 1) g_threads.set(saved_);
  }
  OneThread(const OneThread&) = delete;
  OneThread& operator=(const OneThread&) = delete;

 private:
  int saved_ = 0;
};

// One OpenBLAS thread above `limit` (crash avoidance, above) and at small orders (speed).
inline bool UseOneThread(int64_t n, int64_t limit) { return n > limit || n <= kOneThreadMaxN; }

template <typename T>
struct Routines;

template <>
struct Routines<float> {
  static PotrfFn<float>* potrf() { return g_lapack.spotrf; }
  static PotrfFn<float>* potri() { return g_lapack.spotri; }
  static TrsvFn<float>* trsv() { return g_lapack.strsv; }
  static const Blas3<float>& blas3() { return g_lapack.s3; }
};

template <>
struct Routines<double> {
  static PotrfFn<double>* potrf() { return g_lapack.dpotrf; }
  static PotrfFn<double>* potri() { return g_lapack.dpotri; }
  static TrsvFn<double>* trsv() { return g_lapack.dtrsv; }
  static const Blas3<double>& blas3() { return g_lapack.d3; }
};

// ---- the split factor and inverse -------------------------------------------------------
//
// Column-major, lower triangle, leading dimension lda; every OpenBLAS call of potrf, syrk,
// trtri or lauum is on an order <= limit (see the comment above OneThread). The
// blocks of an order-n matrix A split at n1 = n / 2 (n2 = n - n1):
//   A = [[A11, .], [A21, A22]], A11 n1 x n1 at a, A21 n2 x n1 at a + n1,
//   A22 n2 x n2 at a + n1 (lda + 1).
// The identities are the blocked forms of LAPACK's potrf, trtri and lauum (Golub & Van
// Loan, Matrix Computations, 4th ed., Sec. 4.2.8 and 3.1.4; LAPACK's dpotrf2 recurses the
// same way): with L = [[L11, 0], [L21, L22]],
//   factor:  L11 = chol(A11);  L21 = A21 L11^-T;  L22 = chol(A22 - L21 L21^T);
//   inverse: W = L^-1 = [[W11, 0], [W21, W22]] with W11 = L11^-1, W22 = L22^-1,
//            W21 = -W22 L21 W11;
//   A^-1 = W^T W (lower): [[W11^T W11 + W21^T W21, .], [W22^T W21, W22^T W22]].

inline int AsInt(int64_t v) { return static_cast<int>(v); }

// C (lower, n x n) := alpha op(A) op(A)^T + beta C, op(A) = A (n x k, trans 'N') or A^T
// (A k x n, trans 'T'); orders above `limit` are split, the off-diagonal block by gemm.
template <typename T>
void SplitSyrk(char trans, int64_t n, int64_t k, T alpha, T* a, int64_t lda, T beta, T* c,
               int64_t ldc, int64_t limit) {
  const Blas3<T>& f = Routines<T>::blas3();
  if (n <= limit) {
    char lo = 'L';
    int nn = AsInt(n), kk = AsInt(k), la = AsInt(lda), lc = AsInt(ldc);
    f.syrk(&lo, &trans, &nn, &kk, &alpha, a, &la, &beta, c, &lc);
    return;
  }
  const int64_t n1 = n / 2, n2 = n - n1;
  // rows n1.. of op(A): A + n1 ('N') or columns n1.. of A (A + n1 lda, 'T')
  T* a2 = trans == 'N' ? a + n1 : a + n1 * lda;
  SplitSyrk(trans, n1, k, alpha, a, lda, beta, c, ldc, limit);
  // C21 := alpha op(A)_2 op(A)_1^T + beta C21
  char ta = trans == 'N' ? 'N' : 'T', tb = trans == 'N' ? 'T' : 'N';
  int m = AsInt(n2), nn = AsInt(n1), kk = AsInt(k), la = AsInt(lda), lc = AsInt(ldc);
  f.gemm(&ta, &tb, &m, &nn, &kk, &alpha, a2, &la, a, &la, &beta, c + n1, &lc);
  SplitSyrk(trans, n2, k, alpha, a2, lda, beta, c + n1 * (ldc + 1), ldc, limit);
}

// One LAPACK potrf('L') call on the order-n block at `a`. Returns its info.
template <typename T>
int WholePotrf(T* a, int64_t n, int64_t lda) {
  char lo = 'L';
  int nn = AsInt(n), la = AsInt(std::max<int64_t>(lda, 1)), info = 0;
  Routines<T>::potrf()(&lo, &nn, a, &la, &info);
  return info;
}

// In place: A (lower) -> L. Returns potrf's info (0 or the failing pivot, 1-based).
template <typename T>
int SplitPotrf(T* a, int64_t n, int64_t lda, int64_t limit) {
  if (n <= limit) return WholePotrf(a, n, lda);
  const Blas3<T>& f = Routines<T>::blas3();
  const int64_t n1 = n / 2, n2 = n - n1;
  T* a21 = a + n1;
  T* a22 = a + n1 * (lda + 1);
  if (const int info = SplitPotrf(a, n1, lda, limit); info != 0) return info;
  char r = 'R', lo = 'L', t = 'T', nd = 'N';
  int m = AsInt(n2), nn = AsInt(n1), la = AsInt(lda);
  T one = 1;
  f.trsm(&r, &lo, &t, &nd, &m, &nn, &one, a, &la, a21, &la);  // L21 = A21 L11^-T
  SplitSyrk<T>('N', n2, n1, T(-1), a21, lda, T(1), a22, lda, limit);
  if (const int info = SplitPotrf(a22, n2, lda, limit); info != 0) return AsInt(n1) + info;
  return 0;
}

// In place: L (lower) -> W = L^-1, for L without a zero on its diagonal (the caller checks
// that first, FirstZeroPivot: the solves below would divide by it). Returns trtri's info.
template <typename T>
int SplitTrtri(T* a, int64_t n, int64_t lda, int64_t limit) {
  const Blas3<T>& f = Routines<T>::blas3();
  char lo = 'L', nd = 'N';
  if (n <= limit) {
    int nn = AsInt(n), la = AsInt(std::max<int64_t>(lda, 1)), info = 0;
    f.trtri(&lo, &nd, &nn, a, &la, &info);
    return info;
  }
  const int64_t n1 = n / 2, n2 = n - n1;
  T* a21 = a + n1;
  T* a22 = a + n1 * (lda + 1);
  // W11 and W22 first, then W21 = -W22 (L21 W11) by two triangular products (trmm: at the
  // orders of a GP step, n ~ 350 on one thread, 2-3x faster than the two solves
  // L21 L11^-1 and L22^-1 (..), which need no inverse first)
  if (const int info = SplitTrtri(a, n1, lda, limit); info != 0) return info;
  if (const int info = SplitTrtri(a22, n2, lda, limit); info != 0) return AsInt(n1) + info;
  char l = 'L', r = 'R', nt = 'N';
  int m = AsInt(n2), nn = AsInt(n1), la = AsInt(lda);
  T one = 1, minus_one = -1;
  f.trmm(&r, &lo, &nt, &nd, &m, &nn, &one, a, &la, a21, &la);  // L21 W11
  f.trmm(&l, &lo, &nt, &nd, &m, &nn, &minus_one, a22, &la, a21, &la);  // -W22 (..)
  return 0;
}

// In place: W (lower) -> W^T W (lower).
template <typename T>
int SplitLauum(T* a, int64_t n, int64_t lda, int64_t limit) {
  const Blas3<T>& f = Routines<T>::blas3();
  if (n <= limit) {
    char lo = 'L';
    int nn = AsInt(n), la = AsInt(std::max<int64_t>(lda, 1)), info = 0;
    f.lauum(&lo, &nn, a, &la, &info);
    return info;
  }
  const int64_t n1 = n / 2, n2 = n - n1;
  T* a21 = a + n1;
  T* a22 = a + n1 * (lda + 1);
  if (const int info = SplitLauum(a, n1, lda, limit); info != 0) return info;
  SplitSyrk<T>('T', n1, n2, T(1), a21, lda, T(1), a, lda, limit);  // += W21^T W21
  char l = 'L', lo = 'L', t = 'T', nd = 'N';
  int m = AsInt(n2), nn = AsInt(n1), la = AsInt(lda);
  T one = 1;
  f.trmm(&l, &lo, &t, &nd, &m, &nn, &one, a22, &la, a21, &la);  // W22^T W21
  if (const int info = SplitLauum(a22, n2, lda, limit); info != 0) return AsInt(n1) + info;
  return 0;
}

// The first zero on the diagonal of the order-n block at `a` (1-based, trtri's info), or 0.
template <typename T>
int FirstZeroPivot(const T* a, int64_t n, int64_t lda) {
  for (int64_t j = 0; j < n; ++j) {
    if (a[j * (lda + 1)] == T(0)) return AsInt(j + 1);
  }
  return 0;
}

// potrf('L') of the column-major n x n `a`: split above `limit` when the routines are
// there, else whole (on one OpenBLAS thread above `limit` and up to kOneThreadMaxN).
// Returns potrf's info.
template <typename T>
int CallPotrf(T* a, int64_t n, int64_t limit) {
  if (n > limit && Routines<T>::blas3().ready()) return SplitPotrf(a, n, n, limit);
  OneThread guard(UseOneThread(n, limit));
  return WholePotrf(a, n, n);
}

// Square matrices of order n stacked over the leading dimensions of `dims`.
struct Stack {
  int64_t batch = 1;
  int64_t n = 0;
};

ffi::Error SquareStack(ffi::AnyBuffer::Dimensions dims, const char* what, Stack* out) {
  if (dims.size() < 2 || dims[dims.size() - 1] != dims[dims.size() - 2]) {
    return ffi::Error::InvalidArgument(std::string("gpchol_cpu: ") + what +
                                       " must have shape (..., n, n)");
  }
  out->n = dims[dims.size() - 1];
  if (out->n > std::numeric_limits<int>::max()) {
    return ffi::Error::InvalidArgument(std::string("gpchol_cpu: ") + what +
                                       " is too large for 32-bit LAPACK");
  }
  out->batch = 1;
  for (size_t i = 0; i + 2 < dims.size(); ++i) out->batch *= dims[i];
  return ffi::Error::Success();
}

ffi::Error NotReady() {
  return ffi::Error::Internal(
      "gpchol_cpu: LAPACK routines were not set (gpchol._cpu.ffi loads them first)");
}

// Calls f(i, j) for every strict-upper pair i < j of an n x n matrix, by square blocks so
// that both a[i * n + j] and its mirror a[j * n + i] stay in cache.
template <typename F>
void ForEachUpperPair(int64_t n, F f) {
  constexpr int64_t kBlock = 64;
  for (int64_t ib = 0; ib < n; ib += kBlock) {
    const int64_t ie = std::min(ib + kBlock, n);
    for (int64_t jb = ib; jb < n; jb += kBlock) {
      const int64_t je = std::min(jb + kBlock, n);
      for (int64_t i = ib; i < ie; ++i) {
        for (int64_t j = std::max(jb, i + 1); j < je; ++j) f(i, j);
      }
    }
  }
}

// Row-major lower triangle -> the full symmetric matrix (upper := lower^T).
template <typename T>
void MirrorLowerToUpper(T* a, int64_t n) {
  ForEachUpperPair(n, [a, n](int64_t i, int64_t j) { a[i * n + j] = a[j * n + i]; });
}

// Row-major upper triangle -> the full symmetric matrix (lower := upper^T).
template <typename T>
void MirrorUpperToLower(T* a, int64_t n) {
  ForEachUpperPair(n, [a, n](int64_t i, int64_t j) { a[j * n + i] = a[i * n + j]; });
}

template <typename T>
void FillNan(T* a, int64_t count) {
  const T nan = std::numeric_limits<T>::quiet_NaN();
  for (int64_t i = 0; i < count; ++i) a[i] = nan;
}

// Row-major upper triangle moved to the lower one (lower := upper^T), upper zeroed.
template <typename T>
void MoveUpperToLower(T* a, int64_t n) {
  ForEachUpperPair(n, [a, n](int64_t i, int64_t j) {
    a[j * n + i] = a[i * n + j];
    a[i * n + j] = 0;
  });
}

// In place: LAPACK potrf('L') of the column-major n x n matrix `a` (lower triangle read).
// Returns the reference LAPACK info: 0, or the first pivot (1-based) that is not positive
// -- NaN included. Reference LAPACK's dpotrf2 tests `ajj <= 0 || disnan(ajj)`; OpenBLAS's
// own potrf (the one SciPy and jaxlib ship) tests only `ajj <= 0` and reports success
// with NaN in the factor. A NaN pivot leaves a NaN on the factor's diagonal at the same
// place, so the first NaN there is the pivot reference LAPACK would name.
template <typename T>
int PotrfColumnMajor(T* a, int64_t n, int64_t limit) {
  const int info = CallPotrf(a, n, limit);
  if (info != 0) return info;
  for (int64_t j = 0; j < n; ++j) {
    if (std::isnan(a[j * n + j])) return static_cast<int>(j + 1);
  }
  return 0;
}

// In place: PotrfColumnMajor of the matrix whose row-major lower triangle `a` holds, as
// XLA's Cholesky calls it (see the top comment): the lower triangle is mirrored up first,
// so the column-major lower triangle LAPACK reads is the same matrix. Same info. On
// success the row-major upper triangle holds L^T.
// `symmetric`: the caller guarantees a[i][j] == a[j][i] bit for bit (e.g. K = (A + A^T)/2),
// so the mirror would copy equal numbers onto themselves and is skipped.
template <typename T>
int PotrfAsXla(T* a, int64_t n, int64_t limit, bool symmetric = false) {
  if (!symmetric) MirrorLowerToUpper(a, n);
  return PotrfColumnMajor(a, n, limit);
}

// In place: the row-major lower triangle of `a` (n x n) -> its lower Cholesky factor
// (strict upper zeroed). Returns LAPACK's info; on failure `a` holds LAPACK's partial
// work and the caller overwrites it.
template <typename T>
int FactorLowerInPlace(T* a, int64_t n, int64_t limit, bool symmetric) {
  const int info = PotrfAsXla(a, n, limit, symmetric);
  if (info == 0) MoveUpperToLower(a, n);
  return info;
}

// ---- chol_solve -----------------------------------------------------------------------

// In place: the column-major n x n matrix `a` (lower triangle read) -> its lower Cholesky
// factor, strict upper zeroed: LAPACK potrf('L') exactly as XLA's own CPU Cholesky calls
// it, with no relayout at all. Returns the reference LAPACK info (see PotrfColumnMajor).
template <typename T>
int FactorColumnMajorInPlace(T* a, int64_t n, int64_t limit) {
  const int info = PotrfColumnMajor(a, n, limit);
  if (info != 0) return info;
  // column j's rows 0..j-1 (the strict upper triangle) are contiguous in memory
  for (int64_t j = 1; j < n; ++j) std::fill(a + j * n, a + j * n + j, T(0));
  return 0;
}

// `column_major`: K and L are laid out column-major (the FFI call declares those layouts,
// so XLA writes K that way, usually straight from the fusion that builds it): potrf('L')
// then runs on K as it is, with neither of the two O(n^2) relayout passes below.
template <typename T, ffi::DataType D>
ffi::Error CholSolveImpl(ffi::Buffer<D> K, ffi::Buffer<D> r, ffi::ResultBuffer<D> L,
                         ffi::ResultBuffer<D> alpha, ffi::ResultBuffer<D> quad,
                         ffi::ResultBuffer<D> logdet, ffi::ResultBuffer<ffi::S32> status,
                         bool column_major, bool symmetric, int64_t split_above) {
  if (Routines<T>::potrf() == nullptr || Routines<T>::trsv() == nullptr) return NotReady();
  Stack s;
  if (auto err = SquareStack(K.dimensions(), "K", &s); err.failure()) return err;
  const int64_t n = s.n;
  if (r.element_count() != static_cast<size_t>(s.batch * n)) {
    return ffi::Error::InvalidArgument("gpchol_cpu: r must have shape (..., n) matching K");
  }
  T* l = L->typed_data();
  if (l != K.typed_data()) std::memcpy(l, K.typed_data(), sizeof(T) * s.batch * n * n);
  const T* rv = r.typed_data();
  T* al = alpha->typed_data();
  T* q = quad->typed_data();
  T* ld = logdet->typed_data();
  int32_t* st = status->typed_data();
  const T nan = std::numeric_limits<T>::quiet_NaN();
  char up = 'U', lo = 'L', trans_t = 'T', trans_n = 'N', nondiag = 'N';
  int nn = static_cast<int>(n), lda = std::max(nn, 1), inc = 1;
  for (int64_t b = 0; b < s.batch; ++b) {
    T* lb = l + b * n * n;
    T* ab = al + b * n;
    const int info =
        column_major ? FactorColumnMajorInPlace(lb, n, split_above)
                     : FactorLowerInPlace(lb, n, split_above, symmetric);
    st[b] = info;
    if (info != 0) {
      FillNan(lb, n * n);
      FillNan(ab, n);
      q[b] = nan;
      ld[b] = nan;
      continue;
    }
    // Row-major: the column-major view of lb holds U = L^T in its upper triangle, so
    // U^T z = r (i.e. L z = r), then U alpha = z (i.e. L^T alpha = z). Column-major: L
    // itself, L z = r, then L^T alpha = z.
    char* uplo = column_major ? &lo : &up;
    char* first = column_major ? &trans_n : &trans_t;
    char* second = column_major ? &trans_t : &trans_n;
    std::memcpy(ab, rv + b * n, sizeof(T) * n);
    if (n > 0) Routines<T>::trsv()(uplo, first, &nondiag, &nn, lb, &lda, ab, &inc);
    T zz = 0, sum_log = 0;
    for (int64_t i = 0; i < n; ++i) zz += ab[i] * ab[i];
    if (n > 0) Routines<T>::trsv()(uplo, second, &nondiag, &nn, lb, &lda, ab, &inc);
    for (int64_t i = 0; i < n; ++i) sum_log += std::log(lb[i * n + i]);
    q[b] = zz;
    ld[b] = 2 * sum_log;
  }
  return ffi::Error::Success();
}

// ---- potri ----------------------------------------------------------------------------

// Up to this order potri is computed here, without OpenBLAS: its trtri/lauum (behind
// potri) run multi-threaded from n = 32 on, and the woken thread pool then spins for a
// while, taking a core from XLA's own work for the rest of the step (on this project's
// 2-core CPU an elementwise op on a 50 x 50 matrix took 27 us after a potri call and 15
// us before; a GP step at n = 50 172 us against 130 us with OPENBLAS_NUM_THREADS=1).
// Whole GP value-and-gradient steps with this bound at 64 / 128, us: n = 80: 298 / 216,
// n = 100: 432-593 / 312-341, n = 128: 514-534 / 589-639 (the loops below are slower
// than OpenBLAS's blocked code there, even with its threads).
constexpr int64_t kSmallInverseMaxN = 100;

// Above kSmallInverseMaxN, L^-1 is computed by halving (SplitTrtri: two triangular products
// per level, BLAS-3) down to blocks of at most this order, where trtri is called: OpenBLAS's
// own trtri is several times slower at the orders of a GP step on one thread
// (benchmarks/results/design-measurements.md).
constexpr int64_t kTrtriLeafMaxN = 64;

// In place, n <= kSmallInverseMaxN: the row-major lower triangle of `a` holds L; on
// return `a` holds the full symmetric A^-1 = L^-T L^-1 (A = L L^T). `work` holds n * n + n.
// Returns false, with `a` undefined, when a diagonal entry of L is exactly zero (LAPACK's
// trtri reports that pivot; the caller fills NaN as for potri's info > 0).
template <typename T>
bool InverseFromLowerSmall(T* a, int64_t n, T* work) {
  T* M = work;          // L^-1, row-major lower
  T* t = work + n * n;  // one row's accumulator
  for (int64_t i = 0; i < n; ++i) {
    const T lii = a[i * n + i];
    if (lii == T(0)) return false;
    // row i of L^-1: M[i][j] = -(sum_{j <= k < i} L[i][k] M[k][j]) / L[i][i], j < i;
    // accumulated row by row of M (contiguous, vectorizable)
    std::fill(t, t + i, T(0));
    for (int64_t k = 0; k < i; ++k) {
      const T lik = a[i * n + k];
      const T* mk = M + k * n;
      for (int64_t j = 0; j <= k; ++j) t[j] += lik * mk[j];
    }
    const T inv = T(1) / lii;
    T* mi = M + i * n;
    for (int64_t j = 0; j < i; ++j) mi[j] = -t[j] * inv;
    mi[i] = inv;
  }
  // A^-1 = M^T M = sum_k m_k^T m_k over the rows m_k of M (row k nonzero in 0..k): the
  // lower triangle by rank-one updates, then mirrored (the result is exactly symmetric)
  for (int64_t i = 0; i < n; ++i) std::fill(a + i * n, a + i * n + i + 1, T(0));
  for (int64_t k = 0; k < n; ++k) {
    const T* mk = M + k * n;
    for (int64_t i = 0; i <= k; ++i) {
      const T mki = mk[i];
      T* ai = a + i * n;
      for (int64_t j = 0; j <= i; ++j) ai[j] += mki * mk[j];
    }
  }
  MirrorLowerToUpper(a, n);
  return true;
}

// `upper`: the buffer holds the factor transposed (row-major L^T, i.e. the column-major
// view is L), as XLA's column-major potrf output reaches us without a relayout.
template <typename T, ffi::DataType D>
ffi::Error PotriImpl(ffi::Buffer<D> F, ffi::ResultBuffer<D> out, bool upper,
                     int64_t split_above) {
  if (Routines<T>::potri() == nullptr) return NotReady();
  Stack s;
  if (auto err = SquareStack(F.dimensions(), "the factor", &s); err.failure()) return err;
  const int64_t n = s.n;
  T* o = out->typed_data();
  if (o != F.typed_data()) std::memcpy(o, F.typed_data(), sizeof(T) * s.batch * n * n);
  // Column-major view: the factor sits in its lower triangle when `upper`, else upper.
  char uplo = upper ? 'L' : 'U';
  int nn = static_cast<int>(n), lda = std::max(nn, 1), info = 0;
  std::vector<T> work;
  if (n <= kSmallInverseMaxN) work.resize(static_cast<size_t>(n * n + n));
  for (int64_t b = 0; b < s.batch; ++b) {
    T* ob = o + b * n * n;
    if (n <= kSmallInverseMaxN) {
      if (upper) MoveUpperToLower(ob, n);
      if (!InverseFromLowerSmall(ob, n, work.data())) FillNan(ob, n * n);
      continue;
    }
    info = 0;
    const bool small = n <= kOneThreadMaxN;
    if ((small || n > split_above) && Routines<T>::blas3().ready()) {
      // the split inverse takes the factor in the column-major lower triangle: for
      // `!upper` (the column-major upper triangle holds L^T) it is copied there first
      OneThread guard(small);
      if (!upper) MirrorLowerToUpper(ob, n);
      info = FirstZeroPivot(ob, n, n);
      const int64_t leaf = small ? std::min(split_above, kTrtriLeafMaxN) : split_above;
      if (info == 0) info = SplitTrtri(ob, n, n, leaf);
      if (info == 0) info = SplitLauum(ob, n, n, split_above);
      if (info == 0) MirrorUpperToLower(ob, n);  // column-major lower -> the full matrix
      if (info != 0) FillNan(ob, n * n);
      continue;
    }
    if (n > 0) {
      OneThread guard(UseOneThread(n, split_above));
      Routines<T>::potri()(&uplo, &nn, ob, &lda, &info);
    }
    if (info != 0) {
      FillNan(ob, n * n);
    } else if (upper) {
      MirrorUpperToLower(ob, n);  // A^-1 is in the row-major upper triangle
    } else {
      MirrorLowerToUpper(ob, n);
    }
  }
  return ffi::Error::Success();
}

// ---- potrf_info (the status search) ---------------------------------------------------

template <typename T, ffi::DataType D>
ffi::Error PotrfInfoImpl(ffi::Buffer<D> a, ffi::Buffer<ffi::PRED> mask,
                         ffi::ResultBuffer<ffi::S32> status, int64_t split_above) {
  if (Routines<T>::potrf() == nullptr) return NotReady();
  Stack s;
  if (auto err = SquareStack(a.dimensions(), "a", &s); err.failure()) return err;
  if (mask.element_count() != static_cast<size_t>(s.batch)) {
    return ffi::Error::InvalidArgument("gpchol_cpu: mask must have shape a.shape[:-2]");
  }
  const int64_t n = s.n;
  const bool* m = mask.typed_data();
  int32_t* st = status->typed_data();
  std::vector<T> work;
  for (int64_t b = 0; b < s.batch; ++b) {
    st[b] = 0;
    if (!m[b] || n == 0) continue;
    if (work.empty()) work.resize(static_cast<size_t>(n * n));
    std::memcpy(work.data(), a.typed_data() + b * n * n, sizeof(T) * n * n);
    st[b] = PotrfAsXla(work.data(), n, split_above);
  }
  return ffi::Error::Success();
}

// ---- trsm: a stack of triangular solves, one BLAS call after another --------------------
//
// jaxlib 0.10.2's own batched CPU kernels (its triangular solve and Cholesky) hand the
// matrices of a batch to XLA's intra-op thread pool and block until they are done; when XLA
// runs as many such calls at once as the pool has threads (two on a 2-core machine, e.g.
// the two posterior draws of a vmapped predictive), every thread waits for work that no
// thread is free to run, for ever. This loop stays on the calling thread.

template <typename T, ffi::DataType D>
ffi::Error TrsmImpl(ffi::Buffer<D> a, ffi::Buffer<D> b, ffi::ResultBuffer<D> x, bool left,
                    bool lower, bool transpose) {
  TrsmFn<T>* trsm = Routines<T>::blas3().trsm;
  if (trsm == nullptr) return NotReady();
  Stack s;
  if (auto err = SquareStack(a.dimensions(), "a", &s); err.failure()) return err;
  auto bd = b.dimensions();
  if (bd.size() < 2) {
    return ffi::Error::InvalidArgument("gpchol_cpu: b must have shape (..., m, p)");
  }
  const int64_t rows = bd[bd.size() - 2], cols = bd[bd.size() - 1];
  int64_t batch = 1;
  for (size_t i = 0; i + 2 < bd.size(); ++i) batch *= bd[i];
  if ((left ? rows : cols) != s.n || (s.batch != batch && s.batch != 1)) {
    return ffi::Error::InvalidArgument(
        "gpchol_cpu: a's order or batch does not match b's (a is broadcast only from one "
        "matrix)");
  }
  if (rows > std::numeric_limits<int>::max() || cols > std::numeric_limits<int>::max()) {
    return ffi::Error::InvalidArgument("gpchol_cpu: b is too large for 32-bit BLAS");
  }
  T* out = x->typed_data();
  if (out != b.typed_data()) std::memcpy(out, b.typed_data(), sizeof(T) * batch * rows * cols);
  if (rows == 0 || cols == 0) return ffi::Error::Success();
  // Column-major buffers: BLAS reads them as they are.
  char side = left ? 'L' : 'R', uplo = lower ? 'L' : 'U', trans = transpose ? 'T' : 'N';
  char diag = 'N';
  int m = AsInt(rows), p = AsInt(cols), lda = std::max(AsInt(s.n), 1), ldb = std::max(m, 1);
  T one = T(1);
  const int64_t a_step = s.batch == 1 ? 0 : s.n * s.n;
  T* ap = const_cast<T*>(a.typed_data());
  for (int64_t i = 0; i < batch; ++i) {
    trsm(&side, &uplo, &trans, &diag, &m, &p, &one, ap + i * a_step, &lda, out + i * rows * cols,
         &ldb);
  }
  return ffi::Error::Success();
}

}  // namespace

// ---- exported symbols -----------------------------------------------------------------

// Hands the library SciPy's LAPACK/BLAS routines; returns 0 (all set) or -1 (a null).
GPCHOL_EXPORT int gpchol_cpu_set_lapack(void* spotrf, void* dpotrf, void* spotri,
                                        void* dpotri, void* strsv, void* dtrsv) {
  if (!spotrf || !dpotrf || !spotri || !dpotri || !strsv || !dtrsv) return -1;
  g_lapack.spotrf = reinterpret_cast<PotrfFn<float>*>(spotrf);
  g_lapack.dpotrf = reinterpret_cast<PotrfFn<double>*>(dpotrf);
  g_lapack.spotri = reinterpret_cast<PotrfFn<float>*>(spotri);
  g_lapack.dpotri = reinterpret_cast<PotrfFn<double>*>(dpotri);
  g_lapack.strsv = reinterpret_cast<TrsvFn<float>*>(strsv);
  g_lapack.dtrsv = reinterpret_cast<TrsvFn<double>*>(dtrsv);
  return 0;
}

// Optional: the routines of the split factor and inverse (SplitPotrf, SplitTrtri,
// SplitLauum): float's trsm, trmm, syrk, gemm (BLAS), trtri, lauum (LAPACK), then double's.
// 0 when all are set.
GPCHOL_EXPORT int gpchol_cpu_set_blas3(void* strsm, void* strmm, void* ssyrk, void* sgemm,
                                       void* strtri, void* slauum, void* dtrsm, void* dtrmm,
                                       void* dsyrk, void* dgemm, void* dtrtri, void* dlauum) {
  void* all[] = {strsm, strmm, ssyrk, sgemm, strtri, slauum,
                 dtrsm, dtrmm, dsyrk, dgemm, dtrtri, dlauum};
  for (void* p : all) {
    if (p == nullptr) return -1;
  }
  g_lapack.s3 = {reinterpret_cast<TrsmFn<float>*>(strsm), reinterpret_cast<TrsmFn<float>*>(strmm),
                 reinterpret_cast<SyrkFn<float>*>(ssyrk), reinterpret_cast<GemmFn<float>*>(sgemm),
                 reinterpret_cast<TrtriFn<float>*>(strtri),
                 reinterpret_cast<LauumFn<float>*>(slauum)};
  g_lapack.d3 = {
      reinterpret_cast<TrsmFn<double>*>(dtrsm), reinterpret_cast<TrsmFn<double>*>(dtrmm),
      reinterpret_cast<SyrkFn<double>*>(dsyrk), reinterpret_cast<GemmFn<double>*>(dgemm),
      reinterpret_cast<TrtriFn<double>*>(dtrtri), reinterpret_cast<LauumFn<double>*>(dlauum)};
  return 0;
}

// Optional: OpenBLAS's get/set_num_threads (see OneThread). 0 on success.
GPCHOL_EXPORT int gpchol_cpu_set_threads(void* get, void* set) {
  if (!get || !set) return -1;
  g_threads.get = reinterpret_cast<int (*)()>(get);
  g_threads.set = reinterpret_cast<void (*)(int)>(set);
  return 0;
}

// The order up to which the handlers run OpenBLAS on one thread (gpchol/_cpu/ffi.py reads
// it: a reference computed with SciPy must run the same way to compare a failing pivot).
GPCHOL_EXPORT int64_t gpchol_cpu_one_thread_max_n() { return kOneThreadMaxN; }

// The library is compiled with hidden visibility; each handler is first declared with
// default visibility, which its definition by XLA_FFI_DEFINE_HANDLER_SYMBOL keeps.
#define GPCHOL_HANDLER_EXPORT(NAME) \
  extern "C" __attribute__((visibility("default"))) XLA_FFI_Error* NAME(XLA_FFI_CallFrame*)

#define GPCHOL_CHOL_SOLVE(NAME, T, D)                              \
  GPCHOL_HANDLER_EXPORT(NAME);                                     \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(NAME, (CholSolveImpl<T, D>),       \
                                ffi::Ffi::Bind()                   \
                                    .Arg<ffi::Buffer<D>>()         \
                                    .Arg<ffi::Buffer<D>>()         \
                                    .Ret<ffi::Buffer<D>>()         \
                                    .Ret<ffi::Buffer<D>>()         \
                                    .Ret<ffi::Buffer<D>>()         \
                                    .Ret<ffi::Buffer<D>>()         \
                                    .Ret<ffi::Buffer<ffi::S32>>()  \
                                    .Attr<bool>("column_major")    \
                                    .Attr<bool>("symmetric")       \
                                    .Attr<int64_t>("split_above"))

#define GPCHOL_POTRI(NAME, T, D)                                   \
  GPCHOL_HANDLER_EXPORT(NAME);                                     \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(NAME, (PotriImpl<T, D>),           \
                                ffi::Ffi::Bind()                   \
                                    .Arg<ffi::Buffer<D>>()         \
                                    .Ret<ffi::Buffer<D>>()         \
                                    .Attr<bool>("upper")           \
                                    .Attr<int64_t>("split_above"))

#define GPCHOL_POTRF_INFO(NAME, T, D)                              \
  GPCHOL_HANDLER_EXPORT(NAME);                                     \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(NAME, (PotrfInfoImpl<T, D>),       \
                                ffi::Ffi::Bind()                   \
                                    .Arg<ffi::Buffer<D>>()         \
                                    .Arg<ffi::Buffer<ffi::PRED>>() \
                                    .Ret<ffi::Buffer<ffi::S32>>()  \
                                    .Attr<int64_t>("split_above"))

#define GPCHOL_TRSM(NAME, T, D)                              \
  GPCHOL_HANDLER_EXPORT(NAME);                               \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(NAME, (TrsmImpl<T, D>),      \
                                ffi::Ffi::Bind()             \
                                    .Arg<ffi::Buffer<D>>()   \
                                    .Arg<ffi::Buffer<D>>()   \
                                    .Ret<ffi::Buffer<D>>()   \
                                    .Attr<bool>("left")      \
                                    .Attr<bool>("lower")     \
                                    .Attr<bool>("transpose"))

GPCHOL_CHOL_SOLVE(gpchol_cpu_chol_solve_f32, float, ffi::F32);
GPCHOL_CHOL_SOLVE(gpchol_cpu_chol_solve_f64, double, ffi::F64);
GPCHOL_POTRI(gpchol_cpu_potri_f32, float, ffi::F32);
GPCHOL_POTRI(gpchol_cpu_potri_f64, double, ffi::F64);
GPCHOL_POTRF_INFO(gpchol_cpu_potrf_info_f32, float, ffi::F32);
GPCHOL_POTRF_INFO(gpchol_cpu_potrf_info_f64, double, ffi::F64);
GPCHOL_TRSM(gpchol_cpu_trsm_f32, float, ffi::F32);
GPCHOL_TRSM(gpchol_cpu_trsm_f64, double, ffi::F64);
