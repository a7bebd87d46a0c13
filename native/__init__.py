"""Native CUDA C++ kernels with in-kernel scope instrumentation (include/instrument.cuh),
their loader (build.py), launchers (native_kernels.py) and the host-side decoder (decode.py).
Pure compute: no harness imports."""
