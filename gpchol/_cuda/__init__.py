"""FFI binding of ``kernels_cuda`` (no autodiff here): see :mod:`gpchol._cuda.ffi`."""
