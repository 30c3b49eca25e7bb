// FFI handler symbols for float64 (see handlers.h).
#include "handlers.h"

GPCHOL_POTRF_HANDLER(gpchol_potrf_f64, ffi::F64);
GPCHOL_ADJOINT_HANDLER(gpchol_potrf_adjoint_f64, ffi::F64);
GPCHOL_SMALL_POTRF_HANDLER(gpchol_potrf_small_f64, ffi::F64);
GPCHOL_SMALL_ADJOINT_HANDLER(gpchol_potrf_adjoint_small_f64, ffi::F64);
