// CPU emulation backend: runs the exact host drivers of algorithms.h and the exact
// small-matrix bodies of small.h without a GPU, for the tests.
//
// * BLAS/LAPACK calls are naive column-major loops written from the reference BLAS
//   definitions (the semantics cuBLAS/cuSOLVER implement). They read only the triangle
//   named by `uplo`, check leading dimensions like cuBLAS does, and check that every
//   operand lies inside a registered buffer, so a wrong flag, offset or ld shows up as a
//   wrong number, a NaN from a poisoned triangle, or an error.
// * Elementwise functors and the steps of the small-matrix bodies run in a shuffled order,
//   so a step whose elements depended on each other (a data race on the GPU) would give
//   order-dependent, wrong results.
// * Scratch memory comes from an allocator with the rules of XLA's FFI device allocator
//   (power-of-two alignment up to 16 bytes, else "Unsupported alignment"), whose pointers
//   are 16-aligned but never 256-aligned, optionally with a byte budget (to test the
//   error path); the backend goes through the same aligned_scratch as the CUDA one.
// * The shared memory per block is a parameter, so that the fallback of the small-matrix
//   batches to the large path (potrf_small_batch) can be tested with a lowered limit.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "gpchol/portability.h"
#include "gpchol/scratch.h"
#include "gpchol/small.h"

namespace gpchol::emu {

class CpuBackend {
 public:
  // shared_memory_limit: bytes per thread block (<= 0: unlimited); scratch_budget: bytes
  // the scratch allocator grants in total (< 0: unlimited).
  explicit CpuBackend(std::uint64_t seed, index_t shared_memory_limit = 0,
                      index_t scratch_budget = -1)
      : rng_(seed),
        shared_memory_limit_(shared_memory_limit > 0 ? shared_memory_limit : kUnlimited),
        scratch_budget_(scratch_budget) {}

  // Memory the algorithm may touch (inputs, outputs); scratch is registered automatically.
  void add_buffer(const void* p, size_t bytes) {
    buffers_.push_back({static_cast<const char*>(p), bytes});
  }

  Status scratch(size_t bytes, void** ptr) { return aligned_scratch(*this, bytes, ptr); }

  // The emulated XLA allocator (XLA_FFI_DeviceMemory_Allocate's rules). The memory is
  // poisoned with NaN bytes, so that reading scratch before writing it shows up.
  Status allocate(size_t bytes, size_t alignment, void** ptr) {
    if (alignment == 0 || (alignment & (alignment - 1)) != 0 ||
        alignment > kXlaMaxScratchAlignment) {
      return Status::Error("Unsupported alignment: " + std::to_string(alignment));
    }
    if (scratch_budget_ >= 0 && static_cast<index_t>(bytes) > scratch_budget_) {
      return Status::Error("Out of memory while trying to allocate " + std::to_string(bytes) +
                           " bytes (emulated budget: " + std::to_string(scratch_budget_) +
                           " bytes left)");
    }
    if (scratch_budget_ >= 0) scratch_budget_ -= static_cast<index_t>(bytes);
    // Place the block 16 bytes past a 256-byte boundary: aligned as asked, never more.
    const size_t slack = 2 * kScratchAlignment;
    auto mem = std::make_unique<unsigned char[]>(bytes + slack);
    std::memset(mem.get(), 0xFF, bytes + slack);
    const auto base = reinterpret_cast<std::uintptr_t>(mem.get());
    const auto mask = static_cast<std::uintptr_t>(kScratchAlignment - 1);
    unsigned char* p =
        reinterpret_cast<unsigned char*>(((base + mask) & ~mask) + kXlaMaxScratchAlignment);
    *ptr = p;
    add_buffer(p, bytes);
    scratch_.push_back(std::move(mem));
    return Status::Ok();
  }

  Status shared_memory_limit(index_t* bytes) {
    *bytes = shared_memory_limit_;
    return Status::Ok();
  }

  Status copy(void* dst, const void* src, size_t bytes) {
    GPCHOL_RETURN_IF_ERROR(check_range(dst, bytes, "copy dst"));
    GPCHOL_RETURN_IF_ERROR(check_range(src, bytes, "copy src"));
    std::memmove(dst, src, bytes);
    return Status::Ok();
  }

  Status zero(void* dst, size_t bytes) {
    GPCHOL_RETURN_IF_ERROR(check_range(dst, bytes, "zero"));
    std::memset(dst, 0, bytes);
    return Status::Ok();
  }

  template <typename F>
  Status for_each(index_t count, const F& f) {
    std::vector<index_t> order(static_cast<size_t>(count));
    std::iota(order.begin(), order.end(), index_t(0));
    std::shuffle(order.begin(), order.end(), rng_);
    for (index_t idx : order) f(idx);
    return Status::Ok();
  }

  // ---- column-major LAPACK/BLAS ------------------------------------------------------

  // Upper Cholesky A = U^T U (LAPACK xPOTRF, uplo = 'U', unblocked). Only the upper
  // triangle is read and written. info: 0, or j + 1 for the first pivot that is <= 0 or NaN.
  template <typename T>
  Status potrf_upper(index_t n, T* a, index_t lda, std::int32_t* info) {
    return potrf_ref(n, a, lda, info, [a, lda](index_t r, index_t c) -> T& {
      return a[r + c * lda];
    });
  }

  // Lower Cholesky A = L L^T (uplo = 'L'): the same loop on L^T = U, whose entry (r, c)
  // is L's (c, r). Only the lower triangle is read and written; info as for potrf_upper.
  template <typename T>
  Status potrf_lower(index_t n, T* a, index_t lda, std::int32_t* info) {
    return potrf_ref(n, a, lda, info, [a, lda](index_t r, index_t c) -> T& {
      return a[c + r * lda];
    });
  }

  // The unblocked upper Cholesky, row by row of U, with U(r, c) = u(r, c) for r <= c.
  template <typename T, typename U>
  Status potrf_ref(index_t n, T* a, index_t lda, std::int32_t* info, U u) {
    GPCHOL_RETURN_IF_ERROR(check_ld(lda, n, "potrf lda"));
    GPCHOL_RETURN_IF_ERROR(check_matrix(a, n, n, lda, "potrf A"));
    GPCHOL_RETURN_IF_ERROR(check_range(info, sizeof(std::int32_t), "potrf info"));
    *info = 0;
    for (index_t j = 0; j < n; ++j) {
      T s = u(j, j);
      for (index_t k = 0; k < j; ++k) s -= u(k, j) * u(k, j);
      if (!(s > T(0))) {
        u(j, j) = s;
        *info = static_cast<std::int32_t>(j + 1);
        return Status::Ok();
      }
      const T ujj = std::sqrt(s);
      u(j, j) = ujj;
      for (index_t c = j + 1; c < n; ++c) {
        T t = u(j, c);
        for (index_t k = 0; k < j; ++k) t -= u(k, j) * u(k, c);
        u(j, c) = t / ujj;
      }
    }
    return Status::Ok();
  }

  // Left:  op(A) X = alpha B, A m x m.   Right: X op(A) = alpha B, A n x n.  B is m x n.
  template <typename T>
  Status trsm(Side side, Uplo uplo, Op op, index_t m, index_t n, T alpha, const T* a,
              index_t lda, T* b, index_t ldb) {
    const index_t na = (side == Side::kLeft) ? m : n;
    GPCHOL_RETURN_IF_ERROR(check_ld(lda, na, "trsm lda"));
    GPCHOL_RETURN_IF_ERROR(check_ld(ldb, m, "trsm ldb"));
    GPCHOL_RETURN_IF_ERROR(check_matrix(a, na, na, lda, "trsm A"));
    GPCHOL_RETURN_IF_ERROR(check_matrix(b, m, n, ldb, "trsm B"));
    // t(i, j): element of the triangular operator T = op(tri(A)).
    auto t = [&](index_t i, index_t j) { return tri_op(a, lda, uplo, op, i, j); };
    const bool t_lower = (uplo == Uplo::kLower) != (op == Op::kT);
    if (side == Side::kLeft) {
      // Column by column: T x = alpha b.
      for (index_t c = 0; c < n; ++c) {
        T* x = b + c * ldb;
        for (index_t i = 0; i < m; ++i) x[i] *= alpha;
        if (t_lower) {
          for (index_t i = 0; i < m; ++i) {
            T s = x[i];
            for (index_t l = 0; l < i; ++l) s -= t(i, l) * x[l];
            x[i] = s / t(i, i);
          }
        } else {
          for (index_t i = m - 1; i >= 0; --i) {
            T s = x[i];
            for (index_t l = i + 1; l < m; ++l) s -= t(i, l) * x[l];
            x[i] = s / t(i, i);
          }
        }
      }
    } else {
      // Row by row: x T = alpha b, i.e. T^T x^T = alpha b^T; T^T is lower iff T is upper.
      for (index_t r = 0; r < m; ++r) {
        auto x = [&](index_t j) -> T& { return b[r + j * ldb]; };
        for (index_t j = 0; j < n; ++j) x(j) *= alpha;
        if (!t_lower) {
          for (index_t j = 0; j < n; ++j) {
            T s = x(j);
            for (index_t l = 0; l < j; ++l) s -= x(l) * t(l, j);
            x(j) = s / t(j, j);
          }
        } else {
          for (index_t j = n - 1; j >= 0; --j) {
            T s = x(j);
            for (index_t l = j + 1; l < n; ++l) s -= x(l) * t(l, j);
            x(j) = s / t(j, j);
          }
        }
      }
    }
    return Status::Ok();
  }

  // Left: B <- alpha op(A) B, A m x m.   Right: B <- alpha B op(A), A n x n.
  template <typename T>
  Status trmm(Side side, Uplo uplo, Op op, index_t m, index_t n, T alpha, const T* a,
              index_t lda, T* b, index_t ldb) {
    const index_t na = (side == Side::kLeft) ? m : n;
    GPCHOL_RETURN_IF_ERROR(check_ld(lda, na, "trmm lda"));
    GPCHOL_RETURN_IF_ERROR(check_ld(ldb, m, "trmm ldb"));
    GPCHOL_RETURN_IF_ERROR(check_matrix(a, na, na, lda, "trmm A"));
    GPCHOL_RETURN_IF_ERROR(check_matrix(b, m, n, ldb, "trmm B"));
    std::vector<T> out(static_cast<size_t>(m * n));
    for (index_t j = 0; j < n; ++j) {
      for (index_t i = 0; i < m; ++i) {
        T s = T(0);
        if (side == Side::kLeft) {
          for (index_t l = 0; l < m; ++l) s += tri_op(a, lda, uplo, op, i, l) * b[l + j * ldb];
        } else {
          for (index_t l = 0; l < n; ++l) s += b[i + l * ldb] * tri_op(a, lda, uplo, op, l, j);
        }
        out[i + j * m] = alpha * s;
      }
    }
    for (index_t j = 0; j < n; ++j)
      for (index_t i = 0; i < m; ++i) b[i + j * ldb] = out[i + j * m];
    return Status::Ok();
  }

  // C <- alpha op(A) op(B) + beta C; op(A) m x k, op(B) k x n, C m x n.
  template <typename T>
  Status gemm(Op opa, Op opb, index_t m, index_t n, index_t k, T alpha, const T* a,
              index_t lda, const T* b, index_t ldb, T beta, T* c, index_t ldc) {
    const index_t ar = (opa == Op::kN) ? m : k, ac = (opa == Op::kN) ? k : m;
    const index_t br = (opb == Op::kN) ? k : n, bc = (opb == Op::kN) ? n : k;
    GPCHOL_RETURN_IF_ERROR(check_ld(lda, ar, "gemm lda"));
    GPCHOL_RETURN_IF_ERROR(check_ld(ldb, br, "gemm ldb"));
    GPCHOL_RETURN_IF_ERROR(check_ld(ldc, m, "gemm ldc"));
    GPCHOL_RETURN_IF_ERROR(check_matrix(a, ar, ac, lda, "gemm A"));
    GPCHOL_RETURN_IF_ERROR(check_matrix(b, br, bc, ldb, "gemm B"));
    GPCHOL_RETURN_IF_ERROR(check_matrix(c, m, n, ldc, "gemm C"));
    for (index_t j = 0; j < n; ++j) {
      for (index_t i = 0; i < m; ++i) {
        T s = T(0);
        for (index_t l = 0; l < k; ++l) {
          const T av = (opa == Op::kN) ? a[i + l * lda] : a[l + i * lda];
          const T bv = (opb == Op::kN) ? b[l + j * ldb] : b[j + l * ldb];
          s += av * bv;
        }
        T& cv = c[i + j * ldc];
        cv = (beta == T(0)) ? alpha * s : alpha * s + beta * cv;
      }
    }
    return Status::Ok();
  }

  // Op::kN: C <- alpha A A^T + beta C, A n x k.  Op::kT: C <- alpha A^T A + beta C, A k x n.
  // Only the `uplo` triangle of C is referenced.
  template <typename T>
  Status syrk(Uplo uplo, Op op, index_t n, index_t k, T alpha, const T* a, index_t lda, T beta,
              T* c, index_t ldc) {
    const index_t ar = (op == Op::kN) ? n : k, ac = (op == Op::kN) ? k : n;
    GPCHOL_RETURN_IF_ERROR(check_ld(lda, ar, "syrk lda"));
    GPCHOL_RETURN_IF_ERROR(check_ld(ldc, n, "syrk ldc"));
    GPCHOL_RETURN_IF_ERROR(check_matrix(a, ar, ac, lda, "syrk A"));
    GPCHOL_RETURN_IF_ERROR(check_matrix(c, n, n, ldc, "syrk C"));
    auto opa = [&](index_t i, index_t l) {  // element (i, l) of op(A), n x k
      return (op == Op::kN) ? a[i + l * lda] : a[l + i * lda];
    };
    for (index_t j = 0; j < n; ++j) {
      const index_t i0 = (uplo == Uplo::kUpper) ? 0 : j;
      const index_t i1 = (uplo == Uplo::kUpper) ? j : n - 1;
      for (index_t i = i0; i <= i1; ++i) {
        T s = T(0);
        for (index_t l = 0; l < k; ++l) s += opa(i, l) * opa(j, l);
        T& cv = c[i + j * ldc];
        cv = (beta == T(0)) ? alpha * s : alpha * s + beta * cv;
      }
    }
    return Status::Ok();
  }

  // ---- small-matrix bodies, one emulated thread block per matrix -----------------------

  struct Block {
    std::mt19937_64* rng;
    std::vector<int> order;
    template <typename F>
    void for_each(int count, F&& f) {
      order.resize(static_cast<size_t>(count));
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), *rng);
      for (int idx : order) f(idx);
    }
  };

  // Like a kernel launch on the GPU, refuses more shared memory than the limit allows.
  Status check_shared_memory(index_t bytes) const {
    if (bytes <= shared_memory_limit_) return Status::Ok();
    return Status::Error("the small-matrix kernel needs " + std::to_string(bytes) +
                         " bytes of shared memory per block; this device allows " +
                         std::to_string(shared_memory_limit_));
  }

  template <typename T>
  Status small_potrf(const T* a, T* out, std::int32_t* status, index_t batch, int n) {
    if (n > small_max_n<T>()) return Status::Error("n too large for the small kernel");
    GPCHOL_RETURN_IF_ERROR(check_shared_memory(small_potrf_smem<T>(n)));
    std::vector<T> sm(static_cast<size_t>(small_potrf_smem<T>(n) / sizeof(T)) + 1,
                      nan_<T>());
    Block blk{&rng_, {}};
    const index_t nn = static_cast<index_t>(n) * n;
    for (index_t b = 0; b < batch; ++b) {
      std::fill(sm.begin(), sm.end(), nan_<T>());
      small_potrf_body<T>(blk, a + b * nn, out + b * nn, status + b, n, sm.data());
    }
    return Status::Ok();
  }

  template <typename T>
  Status small_adjoint(const T* L, const T* lbar, T* g, index_t batch, int n) {
    if (n > small_max_n<T>()) return Status::Error("n too large for the small kernel");
    GPCHOL_RETURN_IF_ERROR(check_shared_memory(small_adjoint_smem<T>(n)));
    std::vector<T> sm(static_cast<size_t>(small_adjoint_smem<T>(n) / sizeof(T)) + 1,
                      nan_<T>());
    Block blk{&rng_, {}};
    const index_t nn = static_cast<index_t>(n) * n;
    for (index_t b = 0; b < batch; ++b) {
      std::fill(sm.begin(), sm.end(), nan_<T>());
      small_adjoint_body<T>(blk, L + b * nn, lbar + b * nn, g + b * nn, n, sm.data());
    }
    return Status::Ok();
  }

 private:
  struct Range {
    const char* p;
    size_t bytes;
  };

  template <typename T>
  static T tri_op(const T* a, index_t lda, Uplo uplo, Op op, index_t i, index_t j) {
    const index_t r = (op == Op::kN) ? i : j;
    const index_t c = (op == Op::kN) ? j : i;
    const bool inside = (uplo == Uplo::kUpper) ? (r <= c) : (r >= c);
    return inside ? a[r + c * lda] : T(0);
  }

  static Status check_ld(index_t ld, index_t rows, const char* what) {
    if (ld < std::max<index_t>(1, rows)) {
      std::ostringstream os;
      os << what << " = " << ld << " < max(1, " << rows << ")";
      return Status::Error(os.str());
    }
    return Status::Ok();
  }

  Status check_range(const void* p, size_t bytes, const char* what) const {
    if (bytes == 0) return Status::Ok();
    const char* q = static_cast<const char*>(p);
    for (const Range& r : buffers_) {
      if (q >= r.p && q + bytes <= r.p + r.bytes) return Status::Ok();
    }
    return Status::Error(std::string(what) + " lies outside every buffer");
  }

  template <typename T>
  Status check_matrix(const T* p, index_t rows, index_t cols, index_t ld, const char* what) {
    if (rows == 0 || cols == 0) return Status::Ok();
    const size_t extent = static_cast<size_t>((cols - 1) * ld + rows) * sizeof(T);
    return check_range(p, extent, what);
  }

  static constexpr index_t kUnlimited = index_t(1) << 62;

  std::mt19937_64 rng_;
  index_t shared_memory_limit_;
  index_t scratch_budget_;
  std::vector<Range> buffers_;
  std::vector<std::unique_ptr<unsigned char[]>> scratch_;
};

}  // namespace gpchol::emu
