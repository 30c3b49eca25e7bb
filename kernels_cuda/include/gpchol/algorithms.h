// Host-side drivers of the forward factorization and of Murray's blocked adjoint.
//
// They are written against a backend `Be` (the CUDA one in src/cuda_backend.h, the CPU
// emulation in emulation/cpu_backend.h) that offers, for T in {float, double}:
//
//   Status potrf_upper(index_t n, T* a, index_t lda, std::int32_t* info);
//   Status potrf_lower(index_t n, T* a, index_t lda, std::int32_t* info);
//   Status trsm(Side, Uplo, Op, index_t m, index_t n, T alpha, const T* a, index_t lda,
//               T* b, index_t ldb);                               // in place, non-unit
//   Status trmm(Side, Uplo, Op, index_t m, index_t n, T alpha, const T* a, index_t lda,
//               T* b, index_t ldb);                               // in place, non-unit
//   Status gemm(Op, Op, index_t m, index_t n, index_t k, T alpha, const T* a, index_t lda,
//               const T* b, index_t ldb, T beta, T* c, index_t ldc);
//   Status syrk(Uplo, Op, index_t n, index_t k, T alpha, const T* a, index_t lda, T beta,
//               T* c, index_t ldc);
//   Status for_each(index_t count, const F& f);                  // elementwise.h functors
//   Status copy(void* dst, const void* src, size_t bytes);
//   Status zero(void* dst, size_t bytes);
//   Status scratch(size_t bytes, void** ptr);   // kScratchAlignment (scratch.h); lives
//                                               // until the call ends
//   Status shared_memory_limit(index_t* bytes);  // per thread block, opt-in maximum
//   Status small_potrf<T>(const T* a, T* out, std::int32_t* status, index_t batch, int n);
//   Status small_adjoint<T>(const T* L, const T* lbar, T* g, index_t batch, int n);
//
// with cuBLAS/LAPACK semantics: every BLAS/LAPACK call is COLUMN-MAJOR.
//
// Layout mapping (the one thing to get right here). JAX arrays are row-major. A row-major
// p x q block X stored at pointer x with leading dimension ld is, read column-major with
// the same pointer and ld, the q x p matrix X^T. Hence:
//   * a row-major LOWER triangular L is a column-major UPPER triangular U = L^T;
//   * the row-major product C = op_a(A) op_b(B) is the column-major product
//     C^T = op_b(B)^T op_a(A)^T: call gemm(op_b, op_a, cols(C), rows(C), k, B, A, C)
//     (operands swapped, flags unchanged, m and n swapped);
//   * a row-major triangular solve/multiply from the LEFT with op(L) (L lower) is a
//     column-major one from the RIGHT with op(U) (U = L^T upper), and vice versa:
//     swap the side, flip the triangle, keep the transpose flag, swap m and n.
//   * potrf: the symmetric A's row-major lower triangle is the column-major upper one;
//     cuSOLVER's upper potrf computes A = U^T U there, and U^T is the row-major lower L
//     with A = L L^T. The row-major strict upper triangle is left untouched (zeroed later).
//     A LOWER potrf reads the column-major lower triangle, the row-major upper one, and
//     leaves L there column-major, i.e. L^T row-major: the untiled forward mirrors the
//     input's lower triangle up first and copies the factor down after (the final pass
//     zeroes the upper triangle, as on every path).
#pragma once

#include <algorithm>
#include <cstdint>

#include "gpchol/elementwise.h"
#include "gpchol/portability.h"
#include "gpchol/small.h"

namespace gpchol {

// Default block sizes (the Python side passes 0 for "default").
inline index_t default_adjoint_block(index_t n) { return n >= 16384 ? 512 : 256; }

// ---- forward: L L^T = A, in place ----------------------------------------------------
//
// a: batch x n x n row-major, lower triangle read (may alias `in`; if not, `in` is copied
// into `a` first). On return: L in the lower triangle, zeros above, or all NaN where the
// factorization failed; status[b] = 0 or the 1-based index of the first failing pivot.
//
// tile <= 0 or tile >= n: one library potrf per matrix (cuSOLVER's own blocked algorithm).
// Otherwise gpchol's right-looking tiled algorithm with tile x tile diagonal blocks, in the
// column-major view M = A^T = U^T U (U = L^T upper), for each block column k0:
//   U11 = potrf_upper(M11);  U12 = U11^-T M12 (trsm);  M22 -= U12^T U12 (syrk).
template <typename T, typename Be>
Status potrf_forward(Be& be, const T* in, T* a, std::int32_t* status, index_t batch, index_t n,
                     index_t tile) {
  if (batch == 0) return Status::Ok();
  if (n == 0) return be.zero(status, sizeof(std::int32_t) * batch);
  const index_t nn = n * n;
  if (in != a) GPCHOL_RETURN_IF_ERROR(be.copy(a, in, sizeof(T) * batch * nn));

  if (tile <= 0 || tile >= n) {
    // cuSOLVER's LOWER potrf, the variant XLA's own Cholesky calls, ran faster on an H200
    // than its UPPER one (benchmarks/results/gpu-uplo-2026-12-04.txt); the two extra
    // elementwise passes cost a small part of that.
    GPCHOL_RETURN_IF_ERROR(be.for_each(batch * nn, MirrorLowerToUpper<T>{a, n}));
    for (index_t b = 0; b < batch; ++b) {
      GPCHOL_RETURN_IF_ERROR(be.potrf_lower(n, a + b * nn, n, status + b));
    }
    GPCHOL_RETURN_IF_ERROR(be.for_each(batch * nn, CopyUpperToLower<T>{a, n}));
  } else {
    GPCHOL_RETURN_IF_ERROR(be.zero(status, sizeof(std::int32_t) * batch));
    void* info_raw = nullptr;
    GPCHOL_RETURN_IF_ERROR(be.scratch(sizeof(std::int32_t), &info_raw));
    auto* info = static_cast<std::int32_t*>(info_raw);
    for (index_t b = 0; b < batch; ++b) {
      T* m = a + b * nn;  // column-major M(r, c) = m[r + c * n]
      for (index_t k0 = 0; k0 < n; k0 += tile) {
        const index_t kb = std::min(tile, n - k0);
        const index_t rest = n - k0 - kb;
        T* m11 = m + k0 + k0 * n;
        GPCHOL_RETURN_IF_ERROR(be.potrf_upper(kb, m11, n, info));
        GPCHOL_RETURN_IF_ERROR(
            be.for_each(1, MergeInfo{status + b, info, static_cast<std::int32_t>(k0)}));
        if (rest > 0) {
          T* m12 = m + k0 + (k0 + kb) * n;         // kb x rest
          T* m22 = m + (k0 + kb) + (k0 + kb) * n;  // rest x rest
          GPCHOL_RETURN_IF_ERROR(
              be.trsm(Side::kLeft, Uplo::kUpper, Op::kT, kb, rest, T(1), m11, n, m12, n));
          GPCHOL_RETURN_IF_ERROR(
              be.syrk(Uplo::kUpper, Op::kT, rest, kb, T(-1), m12, n, T(1), m22, n));
        }
      }
    }
  }

  // Status: first of (library info, first diagonal entry that is not positive or is NaN).
  GPCHOL_RETURN_IF_ERROR(be.for_each(batch, StatusZeroToMax{status}));
  GPCHOL_RETURN_IF_ERROR(be.for_each(batch * n, DiagScan<T>{a, n, status}));
  GPCHOL_RETURN_IF_ERROR(be.for_each(batch, StatusMaxToZero{status}));
  return be.for_each(batch * nn, FinalizeFactor<T>{a, n, status});
}

// ---- adjoint: symmetric gradient of a scalar through L = chol(A) ------------------------
//
// L: batch x n x n row-major lower factor (strict upper triangle never read).
// lbar: cotangent of L (strict upper triangle ignored); may alias g.
// g: on return G = (S + S^T) / 2 with S = Sigma_bar_low, the gradient that jax.grad gives
// through jnp.linalg.cholesky.
//
// Murray's blocked reverse pass (arXiv:1602.07527), block columns from the last one, block
// [j0, k0) of width w, with R = L[j0:k0, :j0], D = L[j0:k0, j0:k0], B = L[k0:, :j0],
// C = L[k0:, j0:k0] and the barred blocks in G (which starts as tril(Lbar)):
//   1. Cb <- Cb D^-1            2. Bb <- Bb - Cb R         3. Db <- tril(Db) - tril(Cb^T C)
//   4. Db <- Phi(D^-T (P + P^T) D^-1), P = Phi(D^T Db)     (the symbolic step on the block)
//   5. Rb <- Rb - Cb^T B - (Db + Db^T) R
// The comments give each call in row-major terms; the arguments follow the mapping at the
// top of this file. Step 3 computes the full w x w product; its upper part is discarded by
// the tril of step 4.
template <typename T, typename Be>
Status potrf_adjoint(Be& be, const T* L, const T* lbar, T* g, index_t batch, index_t n,
                     index_t block) {
  if (batch == 0 || n == 0) return Status::Ok();
  const index_t nn = n * n;
  if (lbar != g) GPCHOL_RETURN_IF_ERROR(be.copy(g, lbar, sizeof(T) * batch * nn));
  GPCHOL_RETURN_IF_ERROR(be.for_each(batch * nn, ZeroStrictUpper<T>{g, n}));

  const index_t nb = std::max<index_t>(1, std::min(block > 0 ? block : default_adjoint_block(n), n));
  void* w_raw = nullptr;
  GPCHOL_RETURN_IF_ERROR(be.scratch(sizeof(T) * nb * nb, &w_raw));
  T* W = static_cast<T*>(w_raw);

  const index_t last = ((n - 1) / nb) * nb;
  for (index_t b = 0; b < batch; ++b) {
    const T* Lm = L + b * nn;
    T* Gm = g + b * nn;
    for (index_t j0 = last; j0 >= 0; j0 -= nb) {
      const index_t k0 = std::min(j0 + nb, n);
      const index_t w = k0 - j0;
      const index_t m = n - k0;
      const T* D = Lm + j0 * n + j0;  // w x w, lower
      const T* R = Lm + j0 * n;       // w x j0
      T* Gd = Gm + j0 * n + j0;       // w x w
      T* Gr = Gm + j0 * n;            // w x j0
      if (m > 0) {
        const T* C = Lm + k0 * n + j0;  // m x w
        T* Gc = Gm + k0 * n + j0;       // m x w
        // 1. Cb <- Cb D^-1  (row-major right solve with lower D, no transpose).
        GPCHOL_RETURN_IF_ERROR(
            be.trsm(Side::kLeft, Uplo::kUpper, Op::kN, w, m, T(1), D, n, Gc, n));
        // 2. Bb <- Bb - Cb R.
        if (j0 > 0) {
          GPCHOL_RETURN_IF_ERROR(be.gemm(Op::kN, Op::kN, j0, m, w, T(-1), R, n, Gc, n, T(1),
                                         Gm + k0 * n, n));
        }
        // 3. Db <- Db - Cb^T C (tril taken in step 4).
        GPCHOL_RETURN_IF_ERROR(
            be.gemm(Op::kN, Op::kT, w, w, m, T(-1), C, n, Gc, n, T(1), Gd, n));
      }
      // 4. Symbolic step on the diagonal block, in the w x w scratch W (ld w).
      GPCHOL_RETURN_IF_ERROR(be.for_each(w * w, TrilCopy<T>{Gd, n, W, w, w}));  // W = tril(Db)
      // W <- D^T W  (row-major left multiply by D^T).
      GPCHOL_RETURN_IF_ERROR(be.trmm(Side::kRight, Uplo::kUpper, Op::kT, w, w, T(1), D, n, W, w));
      GPCHOL_RETURN_IF_ERROR(be.for_each(w * w, PhiSymmetrize<T>{W, w}));  // W = P + P^T
      // W <- D^-T W  (row-major left solve with D^T).
      GPCHOL_RETURN_IF_ERROR(be.trsm(Side::kRight, Uplo::kUpper, Op::kT, w, w, T(1), D, n, W, w));
      // W <- W D^-1  (row-major right solve with D).
      GPCHOL_RETURN_IF_ERROR(be.trsm(Side::kLeft, Uplo::kUpper, Op::kN, w, w, T(1), D, n, W, w));
      // Db <- Phi(W) in G; W <- Phi(W) + Phi(W)^T for step 5.
      GPCHOL_RETURN_IF_ERROR(be.for_each(w * w, FinishDiagonalBlock<T>{W, w, Gd, n}));
      if (j0 > 0) {
        // 5. Rb <- Rb - Cb^T B - (Db + Db^T) R.
        if (m > 0) {
          const T* Bl = Lm + k0 * n;      // m x j0
          const T* Gc = Gm + k0 * n + j0;  // m x w
          GPCHOL_RETURN_IF_ERROR(
              be.gemm(Op::kN, Op::kT, j0, w, m, T(-1), Bl, n, Gc, n, T(1), Gr, n));
        }
        GPCHOL_RETURN_IF_ERROR(
            be.gemm(Op::kN, Op::kN, j0, w, w, T(-1), R, n, W, w, T(1), Gr, n));
      }
    }
  }
  return be.for_each(batch * nn, SymmetrizeGradient<T>{g, n});
}

// ---- batches of small matrices: shared memory if it fits, else the large path -----------
//
// The kernels of small.h hold one n x n matrix (forward) or three (adjoint) per thread
// block in shared memory. When that is more than the device's per-block limit
// (Be::shared_memory_limit: a float32 adjoint at n = 128 needs 198 KB, over an A100's
// 163 KB, within an H100/H200's 227 KB), the batch takes the large path instead: one
// library potrf per matrix, and the blocked adjoint with its default block. `path` says
// which one ran.
enum class SmallPath : std::int32_t { kSharedMemory = 1, kLarge = 2 };

template <typename T>
bool small_fits(int n, bool adjoint, index_t shared_memory_limit) {
  const index_t need = adjoint ? small_adjoint_smem<T>(n) : small_potrf_smem<T>(n);
  return n <= small_max_n<T>() && need <= shared_memory_limit;
}

template <typename T, typename Be>
Status potrf_small_batch(Be& be, const T* a, T* out, std::int32_t* status, index_t batch, int n,
                         SmallPath* path) {
  index_t limit = 0;
  GPCHOL_RETURN_IF_ERROR(be.shared_memory_limit(&limit));
  if (small_fits<T>(n, false, limit)) {
    *path = SmallPath::kSharedMemory;
    return be.template small_potrf<T>(a, out, status, batch, n);
  }
  *path = SmallPath::kLarge;
  return potrf_forward<T>(be, a, out, status, batch, n, 0);
}

template <typename T, typename Be>
Status potrf_adjoint_small_batch(Be& be, const T* L, const T* lbar, T* g, index_t batch, int n,
                                 SmallPath* path) {
  index_t limit = 0;
  GPCHOL_RETURN_IF_ERROR(be.shared_memory_limit(&limit));
  if (small_fits<T>(n, true, limit)) {
    *path = SmallPath::kSharedMemory;
    return be.template small_adjoint<T>(L, lbar, g, batch, n);
  }
  *path = SmallPath::kLarge;
  return potrf_adjoint<T>(be, L, lbar, g, batch, n, 0);
}

}  // namespace gpchol
