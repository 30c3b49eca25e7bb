// Elementwise steps of the forward factorization and of the blocked adjoint.
//
// Each step is a functor with `void operator()(index_t idx) const` applied to every idx in
// [0, count). The CUDA backend runs it as a grid-stride kernel, the CPU emulation as a loop
// over a shuffled order. Each functor is written so that no element depends on another one
// written in the same step (so the order, and thread scheduling, cannot change the result).
//
// All matrices are row-major (JAX's layout): element (i, j) of a matrix with leading
// dimension ld sits at offset i * ld + j.
#pragma once

#include "gpchol/portability.h"

namespace gpchol {

// Entry (i, j) of matrix b for the flat index idx of a batch of n x n matrices: the one
// index decomposition of the functors below that run over whole matrices.
struct MatrixEntry {
  index_t b, i, j;
};
GPCHOL_HD MatrixEntry matrix_entry(index_t idx, index_t n) {
  const index_t nn = n * n;
  const index_t b = idx / nn;
  const index_t r = idx - b * nn;
  const index_t i = r / n;
  return {b, i, r - i * n};
}

// ---- forward ------------------------------------------------------------------------

// status[b] = kNoFailure where it is 0 (prepares a running minimum). count = batch.
struct StatusZeroToMax {
  std::int32_t* status;
  GPCHOL_HD void operator()(index_t b) const {
    if (status[b] == 0) status[b] = kNoFailure;
  }
};

// status[b] = 0 where it is still kNoFailure. count = batch.
struct StatusMaxToZero {
  std::int32_t* status;
  GPCHOL_HD void operator()(index_t b) const {
    if (status[b] == kNoFailure) status[b] = 0;
  }
};

// status[b] = min(status[b], i + 1) for every diagonal entry L[b, i, i] that is not a good
// pivot (not positive, or NaN). Catches the failures a library potrf does not report (a
// NaN pivot). count = batch * n.
template <typename T>
struct DiagScan {
  const T* a;
  index_t n;
  std::int32_t* status;
  GPCHOL_HD void operator()(index_t idx) const {
    const index_t b = idx / n;
    const index_t i = idx - b * n;
    const T d = a[b * n * n + i * n + i];
    if (!good_pivot(d)) atomic_min_i32(status + b, static_cast<std::int32_t>(i + 1));
  }
};

// After a diagonal tile of the tiled forward was factored with local LAPACK-style info:
// keep the first failure of the whole matrix. count = 1.
struct MergeInfo {
  std::int32_t* status;      // status of this batch element
  const std::int32_t* info;  // info of the tile just factored
  std::int32_t offset;       // row of the tile's first pivot
  GPCHOL_HD void operator()(index_t) const {
    if (*status == 0 && *info != 0) *status = offset + *info;
  }
};

// Before a column-major LOWER library potrf: copy each matrix's row-major strict lower
// triangle (the one the caller filled) onto its strict upper one, which the library reads
// as its column-major lower triangle. Only the (i > j) element writes the (j, i) one.
// count = batch * n * n.
template <typename T>
struct MirrorLowerToUpper {
  T* a;
  index_t n;
  GPCHOL_HD void operator()(index_t idx) const {
    const auto [b, i, j] = matrix_entry(idx, n);
    if (i > j) a[(b * n + j) * n + i] = a[idx];
  }
};

// After a column-major LOWER library potrf: its factor sits in the row-major strict upper
// triangle as L^T; copy it to the row-major lower triangle (FinalizeFactor then zeroes the
// upper one). Only the (i > j) element writes, reading the (j, i) one. count =
// batch * n * n.
template <typename T>
struct CopyUpperToLower {
  T* a;
  index_t n;
  GPCHOL_HD void operator()(index_t idx) const {
    const auto [b, i, j] = matrix_entry(idx, n);
    if (i > j) a[idx] = a[(b * n + j) * n + i];
  }
};

// Final pass of the forward: zero the strict upper triangle, or fill the whole matrix with
// NaN where the factorization failed. count = batch * n * n.
template <typename T>
struct FinalizeFactor {
  T* a;
  index_t n;
  const std::int32_t* status;
  GPCHOL_HD void operator()(index_t idx) const {
    const auto [b, i, j] = matrix_entry(idx, n);
    if (status[b] != 0) {
      a[idx] = nan_<T>();
    } else if (j > i) {
      a[idx] = T(0);
    }
  }
};

// ---- adjoint ------------------------------------------------------------------------

// Zero the strict upper triangle of every matrix (the cotangent's upper part is ignored).
// count = batch * n * n.
template <typename T>
struct ZeroStrictUpper {
  T* a;
  index_t n;
  GPCHOL_HD void operator()(index_t idx) const {
    const auto [b, i, j] = matrix_entry(idx, n);
    if (j > i) a[idx] = T(0);
  }
};

// dst = tril(src) for a w x w block (dst's strict upper triangle set to 0). count = w * w.
template <typename T>
struct TrilCopy {
  const T* src;
  index_t lds;
  T* dst;
  index_t ldd;
  index_t w;
  GPCHOL_HD void operator()(index_t idx) const {
    const index_t i = idx / w;
    const index_t j = idx - i * w;
    dst[i * ldd + j] = (j <= i) ? src[i * lds + j] : T(0);
  }
};

// W <- Phi(W) + Phi(W)^T in place (Phi: lower triangle, diagonal halved), i.e. copy the
// strict lower triangle onto the strict upper one; the diagonal is unchanged since
// 2 * (W_ii / 2) = W_ii. Only the (i > j) element writes the (j, i) one. count = w * w.
template <typename T>
struct PhiSymmetrize {
  T* w_;
  index_t w;
  GPCHOL_HD void operator()(index_t idx) const {
    const index_t i = idx / w;
    const index_t j = idx - i * w;
    if (i > j) w_[j * w + i] = w_[i * w + j];
  }
};

// Last elementwise step of the diagonal block (Y = D^-T S D^-1 in W):
//   Gd <- Phi(Y)      (the block of the lower-triangular gradient; strict upper set to 0)
//   W  <- Phi(Y) + Phi(Y)^T = Y symmetrized from its lower triangle (used by step 5).
// count = w * w.
template <typename T>
struct FinishDiagonalBlock {
  T* w_;
  index_t w;
  T* gd;
  index_t ldg;
  GPCHOL_HD void operator()(index_t idx) const {
    const index_t i = idx / w;
    const index_t j = idx - i * w;
    if (i > j) {
      const T y = w_[i * w + j];
      gd[i * ldg + j] = y;
      gd[j * ldg + i] = T(0);
      w_[j * w + i] = y;
    } else if (i == j) {
      gd[i * ldg + i] = T(0.5) * w_[i * w + i];
    }
  }
};

// G <- (S + S^T) / 2 from the lower-triangular S = Sigma_bar_low held in G's lower
// triangle: G_ij = G_ji = S_ij / 2 (i > j), G_ii = S_ii. count = batch * n * n.
template <typename T>
struct SymmetrizeGradient {
  T* g;
  index_t n;
  GPCHOL_HD void operator()(index_t idx) const {
    const auto [b, i, j] = matrix_entry(idx, n);
    if (i > j) {
      T* m = g + b * n * n;
      const T v = T(0.5) * m[i * n + j];
      m[i * n + j] = v;
      m[j * n + i] = v;
    }
  }
};

}  // namespace gpchol
