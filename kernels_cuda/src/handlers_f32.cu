// FFI handler symbols for float32 (see handlers.h).
#include "handlers.h"

GPCHOL_POTRF_HANDLER(gpchol_potrf_f32, ffi::F32);
GPCHOL_ADJOINT_HANDLER(gpchol_potrf_adjoint_f32, ffi::F32);
GPCHOL_SMALL_POTRF_HANDLER(gpchol_potrf_small_f32, ffi::F32);
GPCHOL_SMALL_ADJOINT_HANDLER(gpchol_potrf_adjoint_small_f32, ffi::F32);
