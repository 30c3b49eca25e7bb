// Small matrices, one per thread block, held in shared memory: forward factorization and
// adjoint. Used for batches of matrices with n <= kSmallMaxF64 (float64) or
// n <= kSmallMaxF32 (float32).
//
// The bodies are written against a "block" object with one primitive,
//   blk.for_each(count, f): call f(idx) for every idx in [0, count), spread over the
//                           threads of the block, then a barrier (__syncthreads),
// so that the same code runs on the GPU (CUDA threads) and in the CPU emulation (a loop in
// shuffled order). Every for_each step only writes elements that no other idx of the same
// step reads or writes; values needed across steps are read after the barrier. Scalars
// held outside for_each (pivots, the failure flag) are computed identically by every
// thread from shared memory, so control flow is uniform across the block.
//
// Layout: global matrices are row-major n x n (JAX), shared-memory copies are row-major
// with leading dimension ld = small_ld(n) (odd, to avoid bank conflicts on column walks).
#pragma once

#include "gpchol/portability.h"

namespace gpchol {

constexpr int kSmallMaxF64 = 64;
constexpr int kSmallMaxF32 = 128;

template <typename T>
constexpr int small_max_n() {
  return sizeof(T) == 8 ? kSmallMaxF64 : kSmallMaxF32;
}

// Shared memory (bytes) of the two bodies for one n x n matrix.
template <typename T>
constexpr index_t small_potrf_smem(int n) {
  return static_cast<index_t>(n) * small_ld(n) * sizeof(T);
}
template <typename T>
constexpr index_t small_adjoint_smem(int n) {
  return 3 * static_cast<index_t>(n) * small_ld(n) * sizeof(T);
}

// Threads per block for a given n (the widest step has about n * n / 2 elements).
GPCHOL_HD constexpr int small_threads(int n) {
  return n <= 16 ? 64 : n <= 32 ? 128 : n <= 64 ? 256 : 512;
}

// The largest block the small kernels of element type T are launched with: their
// __launch_bounds__, so that ptxas keeps registers per thread within what a block of that
// size can have (65536 / 512 = 128 for float32; for float64's 256 threads, the per-thread
// maximum of 255); without the bound a kernel using more would compile and then fail to
// launch (cudaErrorLaunchOutOfResources).
template <typename T>
constexpr int small_max_threads() {
  return small_threads(small_max_n<T>());
}
static_assert(small_max_threads<float>() == 512 && small_max_threads<double>() == 256,
              "update the register budget in the comment above");

// Right-looking unblocked Cholesky of one matrix in shared memory.
//
// Step k (one barrier each) uses the pivot d_k = A[k][k] as updated by steps < k and
//   - updates the trailing lower triangle: A[i][j] -= A[i][k] A[j][k] / d_k, k < j <= i;
//   - scales the previous column: L[i][k-1] = A[i][k-1] / sqrt(d_{k-1}), i >= k-1
//     (deferred by one step so that column k-1 is not read and written in the same step).
// Status: 0, or k+1 for the first k whose pivot is not positive or is NaN (LAPACK's info);
// a failed factor is written as all NaN. The strict upper triangle is written as zeros.
// `a` and `out` may alias (the input is fully read before anything is written).
template <typename T, typename Block>
GPCHOL_HD void small_potrf_body(Block& blk, const T* a, T* out, std::int32_t* status, int n,
                                T* sm) {
  const int ld = small_ld(n);
  blk.for_each(n * n, [&](int idx) {
    const int i = idx / n;
    const int j = idx - i * n;
    if (j <= i) sm[i * ld + j] = a[idx];
  });

  int fail = 0;
  T dprev = T(1);
  for (int k = 0; k < n; ++k) {
    const T d = sm[k * ld + k];
    if (!good_pivot(d)) {
      fail = k + 1;
      break;
    }
    const T inv_d = T(1) / d;
    const T sprev = sqrt_(dprev);
    const int m = n - k - 1;
    const int nscale = (k > 0) ? (n - k + 1) : 0;
    blk.for_each(m * m + nscale, [&](int idx) {
      if (idx < m * m) {
        // consecutive idx -> consecutive rows i of one column j (stride ld: no conflicts)
        const int c = idx / m;
        const int r = idx - c * m;
        if (r >= c) {
          const int i = k + 1 + r;
          const int j = k + 1 + c;
          sm[i * ld + j] -= sm[i * ld + k] * sm[j * ld + k] * inv_d;
        }
      } else {
        const int i = k - 1 + (idx - m * m);
        T& x = sm[i * ld + (k - 1)];
        x = (i == k - 1) ? sprev : x / sprev;
      }
    });
    dprev = d;
  }
  if (fail == 0 && n > 0) {
    // Last column: only its diagonal entry is left to scale.
    blk.for_each(1, [&](int) { sm[(n - 1) * ld + (n - 1)] = sqrt_(dprev); });
  }
  blk.for_each(n * n, [&](int idx) {
    const int i = idx / n;
    const int j = idx - i * n;
    out[idx] = (fail != 0) ? nan_<T>() : ((j <= i) ? sm[i * ld + j] : T(0));
  });
  blk.for_each(1, [&](int) { *status = fail; });
}

// Adjoint of one small factorization (Murray's symbolic formula, unblocked):
//   P = Phi(L^T Lbar),  S = P + P^T,  Y = L^-T S L^-1,  Sigma_bar_low = Phi(Y),
//   G = (Sigma_bar_low + Sigma_bar_low^T) / 2, i.e. G_ij = Y_max(i,j),min(i,j) / 2.
// Only the lower triangles of L and Lbar are read. `lbar` and `g` may alias.
template <typename T, typename Block>
GPCHOL_HD void small_adjoint_body(Block& blk, const T* L, const T* lbar, T* g, int n, T* sm) {
  const int ld = small_ld(n);
  T* Ls = sm;
  T* Bs = sm + n * ld;
  T* W = sm + 2 * n * ld;

  blk.for_each(n * n, [&](int idx) {
    const int i = idx / n;
    const int j = idx - i * n;
    if (j <= i) {
      Ls[i * ld + j] = L[idx];
      Bs[i * ld + j] = lbar[idx];
    }
  });

  // S = Phi(L^T Lbar) + Phi(L^T Lbar)^T. For i >= j, (L^T Lbar)_ij = sum_{k >= i} L_ki
  // Lbar_kj touches lower-triangle entries only; S_ii = (L^T Lbar)_ii.
  blk.for_each(n * n, [&](int idx) {
    const int i = idx / n;
    const int j = idx - i * n;
    if (j <= i) {
      T p = T(0);
      for (int k = i; k < n; ++k) p += Ls[k * ld + i] * Bs[k * ld + j];
      W[i * ld + j] = p;
      if (i != j) W[j * ld + i] = p;
    }
  });

  // Z = L^-T S: back substitution on L^T (upper), rows from the last one. At step i row i
  // of W has received every update from rows > i; it updates rows k < i with
  // -L[i][k] * Z_i, Z_i = W_i / L[i][i], and divides row i+1 (deferred by one step).
  for (int i = n - 1; i >= 0; --i) {
    const T inv = T(1) / Ls[i * ld + i];
    const bool scale_next = (i + 1 < n);
    const T inv_next = scale_next ? T(1) / Ls[(i + 1) * ld + (i + 1)] : T(1);
    blk.for_each(i * n + (scale_next ? n : 0), [&](int idx) {
      if (idx < i * n) {
        const int k = idx / n;
        const int c = idx - k * n;
        W[k * ld + c] -= Ls[i * ld + k] * (W[i * ld + c] * inv);
      } else {
        const int c = idx - i * n;
        W[(i + 1) * ld + c] *= inv_next;
      }
    });
  }
  if (n > 0) {
    const T inv0 = T(1) / Ls[0];
    blk.for_each(n, [&](int c) { W[c] *= inv0; });
  }

  // Y = Z L^-1: Y L = Z, columns from the last one. At step j column j of W is complete
  // but not yet divided by L[j][j]; it updates columns k < j with -Y_:j L[j][k] and
  // divides column j+1 (deferred by one step).
  for (int j = n - 1; j >= 0; --j) {
    const T inv = T(1) / Ls[j * ld + j];
    const bool scale_next = (j + 1 < n);
    const T inv_next = scale_next ? T(1) / Ls[(j + 1) * ld + (j + 1)] : T(1);
    blk.for_each(n * j + (scale_next ? n : 0), [&](int idx) {
      if (idx < n * j) {
        const int r = idx / j;
        const int k = idx - r * j;
        W[r * ld + k] -= (W[r * ld + j] * inv) * Ls[j * ld + k];
      } else {
        const int r = idx - n * j;
        W[r * ld + (j + 1)] *= inv_next;
      }
    });
  }
  if (n > 0) {
    const T inv0 = T(1) / Ls[0];
    blk.for_each(n, [&](int r) { W[r * ld] *= inv0; });
  }

  blk.for_each(n * n, [&](int idx) {
    const int i = idx / n;
    const int j = idx - i * n;
    g[idx] = T(0.5) * ((j <= i) ? W[i * ld + j] : W[j * ld + i]);
  });
}

}  // namespace gpchol
