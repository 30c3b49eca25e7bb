// Scratch memory rules shared by the CUDA backend and the CPU emulation.
//
// XLA's FFI device allocator (XLA_FFI_DeviceMemory_Allocate in xla/ffi/ffi_api.cc) accepts
// power-of-two alignments up to 16 bytes and refuses anything larger with "Unsupported
// alignment". Both backends therefore ask their allocator for kScratchRequestAlignment and
// pad the request so that the pointer handed to the drivers can be rounded up to
// kScratchAlignment, the alignment cuBLAS/cuSOLVER workspaces want. The emulation's
// allocator refuses what XLA's refuses and returns pointers that are 16-aligned but never
// 256-aligned, so a driver or backend that relied on more is caught without a GPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "gpchol/portability.h"

namespace gpchol {

// Largest alignment XLA's FFI device allocator accepts (kMaxAlignment in ffi_api.cc).
constexpr std::size_t kXlaMaxScratchAlignment = 16;
// The alignment both backends ask their allocator for.
constexpr std::size_t kScratchRequestAlignment = 16;
// The alignment of every pointer Be::scratch returns to the drivers.
constexpr std::size_t kScratchAlignment = 256;

static_assert(kScratchRequestAlignment <= kXlaMaxScratchAlignment,
              "XLA's FFI allocator refuses alignments above 16 bytes");
static_assert((kScratchAlignment & (kScratchAlignment - 1)) == 0, "power of two");

// Bytes to request for `bytes` usable bytes at kScratchAlignment (at least 1 usable byte).
inline std::size_t scratch_request_bytes(std::size_t bytes) {
  return (bytes > 0 ? bytes : 1) + (kScratchAlignment - kScratchRequestAlignment);
}

inline void* align_scratch(void* p) {
  const auto v = reinterpret_cast<std::uintptr_t>(p);
  const auto mask = static_cast<std::uintptr_t>(kScratchAlignment - 1);
  return reinterpret_cast<void*>((v + mask) & ~mask);
}

// Be::scratch of both backends: `bytes` usable bytes at kScratchAlignment from `alloc`, an
// allocator with `Status allocate(size_t bytes, size_t alignment, void** ptr)` whose error
// message says why (for the CUDA backend: XLA's own message). Lives until the call ends.
template <typename Alloc>
Status aligned_scratch(Alloc& alloc, std::size_t bytes, void** ptr) {
  const std::size_t request = scratch_request_bytes(bytes);
  void* raw = nullptr;
  Status s = alloc.allocate(request, kScratchRequestAlignment, &raw);
  if (!s.ok()) {
    return Status::Error("could not allocate " + std::to_string(bytes) +
                         " bytes of scratch device memory (requested " +
                         std::to_string(request) + " bytes at alignment " +
                         std::to_string(kScratchRequestAlignment) + "): " + s.message());
  }
  *ptr = align_scratch(raw);
  return Status::Ok();
}

}  // namespace gpchol
