"""FFI binding of gpchol's compiled CPU handlers (LAPACK on XLA's buffers): see
:mod:`gpchol._cpu.ffi`."""
