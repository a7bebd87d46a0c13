// torch extension bindings for the native instrumented kernels (built by native/build.py).
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include "launchers.h"

namespace {
uint32_t *prof_ptr(const at::Tensor &buf) {
  if (buf.numel() == 0) return nullptr;
  TORCH_CHECK(buf.is_cuda() && buf.scalar_type() == at::kInt && buf.is_contiguous(), "profile buffer: int32 cuda");
  return reinterpret_cast<uint32_t *>(buf.data_ptr<int32_t>());
}
void *cur_stream() { return (void *)at::cuda::getCurrentCUDAStream().stream(); }
void check(int err, const char *what) { TORCH_CHECK(err == 0, what, " launch failed: cudaError ", err); }
void check_f16(const at::Tensor &t, const char *n) {
  TORCH_CHECK(t.is_cuda() && t.scalar_type() == at::kHalf && t.is_contiguous(), n, ": contiguous fp16 cuda tensor");
}
}  // namespace

void matmul(at::Tensor a, at::Tensor b, at::Tensor c, at::Tensor prof, int64_t capacity) {
  check_f16(a, "a");
  check_f16(b, "b");
  TORCH_CHECK(c.scalar_type() == at::kFloat && c.is_contiguous(), "c: contiguous fp32");
  check(native_matmul_f16(a.data_ptr(), b.data_ptr(), c.data_ptr<float>(), a.size(0), b.size(1), a.size(1),
                          prof_ptr(prof), (uint32_t)capacity, cur_stream()),
        "matmul");
}

void softmax(at::Tensor x, at::Tensor y, at::Tensor prof, int64_t capacity) {
  check_f16(x, "x");
  check(native_softmax_f16(x.data_ptr(), y.data_ptr(), x.size(0), x.size(1), prof_ptr(prof), (uint32_t)capacity,
                           cur_stream()),
        "softmax");
}

void layer_norm(at::Tensor x, at::Tensor w, at::Tensor b, at::Tensor y, double eps, at::Tensor prof,
                int64_t capacity) {
  check_f16(x, "x");
  check_f16(w, "weight");
  check_f16(b, "bias");
  check(native_layer_norm_f16(x.data_ptr(), w.data_ptr(), b.data_ptr(), y.data_ptr(), x.size(0), x.size(1),
                              (float)eps, prof_ptr(prof), (uint32_t)capacity, cur_stream()),
        "layer_norm");
}

void calibrate(int64_t spin_cycles, int64_t blocks, int64_t threads, at::Tensor sink, at::Tensor prof,
               int64_t capacity) {
  check(native_calibrate((uint64_t)spin_cycles, (int)blocks, (int)threads,
                         reinterpret_cast<unsigned long long *>(sink.data_ptr<int64_t>()), prof_ptr(prof),
                         (uint32_t)capacity, cur_stream()),
        "calibrate");
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("matmul", &matmul);
  m.def("softmax", &softmax);
  m.def("layer_norm", &layer_norm);
  m.def("calibrate", &calibrate);
}
