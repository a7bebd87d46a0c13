// torch extension bindings for the native kernels (built by native/build.py): the instrumented suite kernels
// (matmul, softmax, layer_norm, calibrate) and the low-bit matmul (lowbit_*).
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include "launchers.h"
#include "lowbit_params.h"

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

void matmul(at::Tensor a, at::Tensor b, at::Tensor c, at::Tensor prof, int64_t capacity, int64_t mode) {
  check_f16(a, "a");
  check_f16(b, "b");
  TORCH_CHECK(c.scalar_type() == at::kFloat && c.is_contiguous(), "c: contiguous fp32");
  check(native_matmul_f16(a.data_ptr(), b.data_ptr(), c.data_ptr<float>(), a.size(0), b.size(1), a.size(1),
                          prof_ptr(prof), (uint32_t)capacity, (int)mode, cur_stream()),
        "matmul");
}

void softmax(at::Tensor x, at::Tensor y, at::Tensor prof, int64_t capacity, int64_t mode) {
  check_f16(x, "x");
  check(native_softmax_f16(x.data_ptr(), y.data_ptr(), x.size(0), x.size(1), prof_ptr(prof), (uint32_t)capacity,
                           (int)mode, cur_stream()),
        "softmax");
}

void layer_norm(at::Tensor x, at::Tensor w, at::Tensor b, at::Tensor y, double eps, at::Tensor prof,
                int64_t capacity, int64_t mode) {
  check_f16(x, "x");
  check_f16(w, "weight");
  check_f16(b, "bias");
  check(native_layer_norm_f16(x.data_ptr(), w.data_ptr(), b.data_ptr(), y.data_ptr(), x.size(0), x.size(1),
                              (float)eps, prof_ptr(prof), (uint32_t)capacity, (int)mode, cur_stream()),
        "layer_norm");
}

void calibrate(int64_t spin_cycles, int64_t blocks, int64_t threads, at::Tensor sink, at::Tensor prof,
               int64_t capacity, int64_t mode) {
  check(native_calibrate((uint64_t)spin_cycles, (int)blocks, (int)threads,
                         reinterpret_cast<unsigned long long *>(sink.data_ptr<int64_t>()), prof_ptr(prof),
                         (uint32_t)capacity, (int)mode, cur_stream()),
        "calibrate");
}

// ---- native low-bit matmul (native/lowbit.py drives these; layouts in native/lowbit_layout.py)
namespace {
void check_cuda_contig(const at::Tensor &t, const char *n) {
  TORCH_CHECK(t.is_cuda() && t.is_contiguous(), n, ": contiguous cuda tensor");
  TORCH_CHECK(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0, n, ": 16-byte aligned");
}
void check_lowbit(int err, const std::string &recipe, const char *what) {
  TORCH_CHECK(err != -1, what, ": no instantiation for recipe ", recipe, " with these options");
  TORCH_CHECK(err == 0, what, " (", recipe, ") launch failed: cudaError ", err);
}
}  // namespace

int64_t lowbit_gemv(const std::string &recipe, int64_t mt, bool xsplit, int64_t prof, at::Tensor wq, at::Tensor sc,
                    at::Tensor stab, at::Tensor x, at::Tensor y, at::Tensor y32, at::Tensor counters, int64_t M,
                    int64_t K, int64_t N, int64_t Npad, int64_t iters, int64_t nblocks, int64_t ngroups,
                    int64_t slots, at::Tensor prof_buf, int64_t capacity, int64_t sms, int64_t grid,
                    int64_t variant) {
  check_cuda_contig(wq, "wq");
  check_cuda_contig(sc, "scales");
  check_cuda_contig(stab, "stage table");
  check_cuda_contig(x, "x");
  check_cuda_contig(y, "y");
  check_cuda_contig(y32, "workspace");
  check_cuda_contig(counters, "counters");
  TORCH_CHECK(x.dim() == 2 && x.size(1) == K && K % 8 == 0, "x: [MX, K] with K % 8 == 0");
  TORCH_CHECK(y.dim() == 2 && y.size(0) == M && y.size(1) == N, "y: [M, N]");
  TORCH_CHECK(y.scalar_type() == at::kHalf || y.scalar_type() == at::kBFloat16, "y: f16 or bf16");
  TORCH_CHECK(y32.scalar_type() == at::kFloat && y32.numel() >= M * Npad, "workspace: >= M * Npad f32");
  TORCH_CHECK(counters.scalar_type() == at::kInt && counters.numel() >= nblocks, "counters: >= nblocks int32");
  const bool out_bf16 = y.scalar_type() == at::kBFloat16;
  const int64_t MX = x.size(0);
  TORCH_CHECK(MX == (xsplit ? 2 * M : M), "x rows: M (or 2M with xsplit)");
  TORCH_CHECK(MX <= 8 * mt, "x rows exceed the m16n8 tiles of this variant");
  lowbit::GemvParams p{};
  p.wq = wq.data_ptr();
  p.sc = sc.data_ptr();
  p.stab = reinterpret_cast<const uint32_t *>(stab.data_ptr<int32_t>());
  p.x = x.data_ptr();
  p.y = y.data_ptr();
  p.y32 = y32.data_ptr<float>();
  p.counters = counters.data_ptr<int32_t>();
  p.M = (int)M, p.MX = (int)MX, p.K = (int)K, p.N = (int)N, p.Npad = (int)Npad;
  p.iters = (int)iters, p.nblocks = (int)nblocks, p.ngroups = (int)ngroups, p.slots = (int)slots;
  TORCH_CHECK(prof >= 0 && prof <= 2, "prof: 0 (plain), 1 (staged) or 2 (warp0)");
  TORCH_CHECK(!prof || prof_buf.numel() > 0, "an instrumented launch needs a profile buffer");
  p.prof = prof ? prof_ptr(prof_buf) : nullptr;
  p.prof_cap = (uint32_t)capacity;
  p.variant = (int)variant;
  int used = 0;
  check_lowbit(native_lowbit_gemv(recipe.c_str(), (int)mt, out_bf16, xsplit, (int)prof, &p, (int)sms, cur_stream(),
                                  (int)grid, &used),
               recipe, "lowbit_gemv");
  return used;
}

// u1 at M = 1 through a table of partial sums of x (native/kernels/lowbit_lut.cu; layout: native/lowbit_lut.py):
// the arguments both of its forms take; returns K
static int64_t check_lut(const at::Tensor &x, const at::Tensor &words, const at::Tensor &scales,
                         const at::Tensor &zeros, const at::Tensor &y, const at::Tensor &ws,
                         const at::Tensor &counters, int64_t group, int64_t counters_needed) {
  check_cuda_contig(x, "x");
  check_cuda_contig(words, "words");
  check_cuda_contig(scales, "scales");
  check_cuda_contig(zeros, "zeros");
  check_cuda_contig(y, "y");
  check_cuda_contig(ws, "workspace");
  check_cuda_contig(counters, "counters");
  TORCH_CHECK(x.dim() == 2 && x.size(0) == 1, "x: [1, K]");
  const int64_t K = x.size(1), N = y.size(-1), units = (K + 127) / 128;
  TORCH_CHECK(y.numel() == N && y.scalar_type() == x.scalar_type(), "y: [1, N] in x's dtype");
  TORCH_CHECK(x.scalar_type() == at::kHalf || x.scalar_type() == at::kBFloat16, "x: f16 or bf16");
  TORCH_CHECK(scales.scalar_type() == x.scalar_type() && zeros.scalar_type() == x.scalar_type() &&
                  scales.sizes() == zeros.sizes() && scales.dim() == 2 && scales.size(1) == N,
              "scales, zeros: [groups, N] in x's dtype");
  TORCH_CHECK(words.scalar_type() == at::kInt && words.numel() == units * N * 4, "words: int32 [units, N, 4]");
  TORCH_CHECK(native_lowbit_lut_ok((int)K, (int)group), "lowbit_lut: group ", group, " with K = ", K);
  TORCH_CHECK(scales.size(0) == ((group == -1 || group == K) ? 1 : K / group), "scales: one row per group");
  TORCH_CHECK(ws.scalar_type() == at::kFloat && ws.numel() >= N, "workspace: >= N f32");
  TORCH_CHECK(counters.scalar_type() == at::kInt && counters.numel() >= counters_needed, "counters: >= ",
              counters_needed, " int32");
  return K;
}

static void check_lut_err(int err, const char *what) {
  TORCH_CHECK(err >= 0, what, ": bad arguments (", err, ")");
  TORCH_CHECK(err == 0, what, " launch failed: cudaError ", err);
}

void lowbit_lut(at::Tensor x, at::Tensor words, at::Tensor scales, at::Tensor zeros, at::Tensor y, at::Tensor ws,
                at::Tensor counters, int64_t group, int64_t ks, int64_t ct) {
  const int64_t N = y.size(-1);
  const int64_t K = check_lut(x, words, scales, zeros, y, ws, counters, group, (N + 255) / 256);
  check_lut_err(native_lowbit_lut(x.data_ptr(), words.data_ptr(), scales.data_ptr(), zeros.data_ptr(),
                                  ws.data_ptr<float>(), reinterpret_cast<unsigned *>(counters.data_ptr<int32_t>()),
                                  y.data_ptr(), (int)K, (int)N, (int)group, x.scalar_type() == at::kBFloat16, (int)ks,
                                  (int)ct, cur_stream()),
                "lowbit_lut");
}

// its span form (its own layout: native/lowbit_lut.py, span_pack): nbx blocks of `threads` along N per 4096 k
void lowbit_lut_span(at::Tensor x, at::Tensor words, at::Tensor sz, at::Tensor y, at::Tensor ws, at::Tensor counters,
                     int64_t group, int64_t nbx, int64_t threads) {
  check_cuda_contig(x, "x");
  check_cuda_contig(words, "words");
  check_cuda_contig(sz, "scale / zero pairs");
  check_cuda_contig(y, "y");
  check_cuda_contig(ws, "workspace");
  check_cuda_contig(counters, "counters");
  TORCH_CHECK(x.dim() == 2 && x.size(0) == 1, "x: [1, K]");
  TORCH_CHECK(x.scalar_type() == at::kHalf || x.scalar_type() == at::kBFloat16, "x: f16 or bf16");
  const int64_t K = x.size(1), N = y.size(-1), spans = ((K + 127) / 128 + 31) / 32, chunks = (N + 3) / 4;
  const int64_t slots = group == 32 ? 4 : group == 64 ? 2 : 1;
  TORCH_CHECK(y.numel() == N && y.scalar_type() == x.scalar_type(), "y: [1, N] in x's dtype");
  TORCH_CHECK(native_lowbit_lut_ok((int)K, (int)group), "lowbit_lut_span: group ", group, " with K = ", K);
  TORCH_CHECK(words.scalar_type() == at::kInt && words.numel() == spans * chunks * 4 * 32 * 4,
              "words: int32 [spans, N / 4, 4, 32, 4]");
  TORCH_CHECK(sz.scalar_type() == x.scalar_type() && sz.numel() == spans * chunks * 4 * 32 * slots * 2,
              "scale / zero pairs: [spans, N / 4, 4, 32, ", slots, ", 2] in x's dtype");
  TORCH_CHECK(ws.scalar_type() == at::kFloat && ws.numel() >= N, "workspace: >= N f32");
  TORCH_CHECK(counters.scalar_type() == at::kInt && counters.numel() >= nbx, "counters: >= ", nbx, " int32");
  TORCH_CHECK(nbx >= 1 && nbx <= chunks, "lowbit_lut_span: nbx ", nbx, " outside 1 .. ", chunks);
  TORCH_CHECK(threads == 256 || threads == 512 || threads == 1024, "lowbit_lut_span: threads ", threads,
              ": 256, 512 or 1024");
  check_lut_err(native_lowbit_lut_span(x.data_ptr(), words.data_ptr(), sz.data_ptr(), ws.data_ptr<float>(),
                                       reinterpret_cast<unsigned *>(counters.data_ptr<int32_t>()), y.data_ptr(),
                                       (int)K, (int)N, (int)group, x.scalar_type() == at::kBFloat16, (int)nbx,
                                       (int)threads, cur_stream()),
                "lowbit_lut_span");
}

// the span form's memory side alone (a diagnostic: native/lut_tune.py --probe)
void lowbit_lut_span_probe(at::Tensor words, at::Tensor sz, at::Tensor out, int64_t K, int64_t nbx, int64_t ahead,
                           bool contig, bool slots) {
  check_cuda_contig(words, "words");
  check_cuda_contig(sz, "scale / zero pairs");
  check_cuda_contig(out, "out");
  TORCH_CHECK(words.scalar_type() == at::kInt && words.dim() == 5 && words.size(2) == 4 && words.size(3) == 32 &&
              words.size(4) == 4, "words: int32 [spans, N / 4, 4, 32, 4]");
  const int64_t spans = ((K + 127) / 128 + 31) / 32, chunks = words.size(1);
  TORCH_CHECK(words.size(0) == spans, "words: ", spans, " spans for K = ", K);
  TORCH_CHECK(sz.element_size() == 2 && sz.numel() == spans * chunks * 4 * 32 * 2,
              "scale / zero pairs: [spans, N / 4, 4, 32, 1, 2] (one slot a unit)");
  TORCH_CHECK(out.scalar_type() == at::kInt && out.numel() == 1, "out: one int32");
  TORCH_CHECK(nbx >= 1 && nbx <= chunks, "lowbit_lut_span_probe: nbx ", nbx, " outside 1 .. ", chunks);
  TORCH_CHECK(ahead == 1 || ahead == 2, "lowbit_lut_span_probe: ahead ", ahead, ": 1 or 2");
  check_lut_err(native_lowbit_lut_span_probe(words.data_ptr(), sz.data_ptr(),
                                             reinterpret_cast<unsigned *>(out.data_ptr<int32_t>()), (int)K,
                                             (int)(4 * chunks), (int)nbx, (int)ahead, contig ? 1 : 0,
                                             slots ? 1 : 0, cur_stream()),
                "lowbit_lut_span_probe");
}

// the plainest fast reader of two buffers' bytes (the probe's yardstick: native/lut_tune.py --probe)
void stream_read_xor(at::Tensor a, at::Tensor b, at::Tensor out, int64_t blocks, int64_t threads) {
  check_cuda_contig(a, "a");
  check_cuda_contig(b, "b");
  check_cuda_contig(out, "out");
  for (const at::Tensor *t : {&a, &b})
    TORCH_CHECK(t->nbytes() % 16 == 0 && reinterpret_cast<uintptr_t>(t->data_ptr()) % 16 == 0,
                "stream_read_xor: buffers of whole, aligned 16-byte words");
  TORCH_CHECK(out.scalar_type() == at::kInt && out.numel() == 1, "out: one int32");
  TORCH_CHECK(blocks >= 1 && (threads == 256 || threads == 512 || threads == 1024),
              "stream_read_xor: blocks >= 1, threads 256 / 512 / 1024");
  check(native_stream_read_xor(a.data_ptr(), (long long)(a.nbytes() / 16), b.data_ptr(), (long long)(b.nbytes() / 16),
                               reinterpret_cast<unsigned *>(out.data_ptr<int32_t>()), (int)blocks, (int)threads,
                               cur_stream()),
        "stream_read_xor");
}

int64_t lowbit_gemv_grid(const std::string &recipe, int64_t mt, bool xsplit, int64_t prof, bool out_bf16, int64_t MX,
                         int64_t slots, int64_t iters, int64_t nblocks, int64_t sms, int64_t grid,
                         int64_t variant) {
  lowbit::GemvParams p{};
  p.MX = (int)MX, p.slots = (int)slots, p.iters = (int)iters, p.nblocks = (int)nblocks;
  p.variant = (int)variant;
  TORCH_CHECK(prof >= 0 && prof <= 2, "prof: 0 (plain), 1 (staged) or 2 (warp0)");
  const int g = native_lowbit_gemv_grid(recipe.c_str(), (int)mt, out_bf16, xsplit, (int)prof, &p, (int)sms, (int)grid);
  TORCH_CHECK(g > 0, "lowbit_gemv_grid: no instantiation for recipe ", recipe, " with these options");
  return g;
}

void lowbit_dequant(const std::string &recipe, at::Tensor wq, at::Tensor scales, at::Tensor zeros, at::Tensor out,
                    int64_t K, int64_t N, int64_t iters, int64_t nb0, int64_t nblk, int64_t group) {
  check_cuda_contig(wq, "wq");
  check_cuda_contig(scales, "scales");
  check_cuda_contig(out, "out");
  TORCH_CHECK(K % 8 == 0 && group % 8 == 0, "K and the group size must be multiples of 8");
  TORCH_CHECK(out.numel() >= nblk * 256 * K, "out: >= nblk * 256 rows of K");
  lowbit::DequantParams p{};
  p.wq = wq.data_ptr();
  p.scales = scales.data_ptr();
  p.zeros = zeros.numel() ? zeros.data_ptr() : nullptr;
  p.out = out.data_ptr();
  p.K = (int)K, p.N = (int)N, p.iters = (int)iters, p.nb0 = (int)nb0, p.group = (int)group;
  check_lowbit(native_lowbit_dequant(recipe.c_str(), out.scalar_type() == at::kBFloat16, &p, (int)nblk,
                                     cur_stream()),
               recipe, "lowbit_dequant");
}

bool lowbit_fused_built(const std::string &recipe, bool out_bf16) {
  return native_lowbit_fused(recipe.c_str(), out_bf16, nullptr, nullptr) == 0;
}

void lowbit_fused(const std::string &recipe, at::Tensor wq, at::Tensor sc, at::Tensor xp, at::Tensor y, int64_t N,
                  int64_t iters, int64_t nblocks, int64_t ngroups, int64_t group, int64_t build) {
  check_cuda_contig(wq, "wq");
  check_cuda_contig(sc, "sc");
  check_cuda_contig(xp, "xp");
  check_cuda_contig(y, "y");
  const int64_t bm = lowbit::fused_bm((int)build);
  TORCH_CHECK(xp.dim() == 2 && y.dim() == 2 && xp.size(0) == (y.size(0) + bm - 1) / bm * bm && y.size(1) == N,
              "xp [ceil(M / bm) * bm, Kpad] (bm = 128, 256 for the wide build), y [M, N]");
  TORCH_CHECK(xp.scalar_type() == y.scalar_type(), "xp and y: the activation dtype");
  TORCH_CHECK(xp.size(1) % 128 == 0 && group % 8 == 0 && group > 0, "Kpad a multiple of 128, group a multiple of 8");
  lowbit::FusedParams p{};
  p.wq = wq.data_ptr();
  p.sc = sc.data_ptr();
  p.xp = xp.data_ptr();
  p.y = y.data_ptr();
  p.M = (int)y.size(0), p.N = (int)N, p.Kpad = (int)xp.size(1), p.iters = (int)iters, p.nblocks = (int)nblocks;
  p.ngroups = (int)ngroups, p.group = (int)group, p.build = (int)build;
  check_lowbit(native_lowbit_fused(recipe.c_str(), y.scalar_type() == at::kBFloat16, &p, cur_stream()), recipe,
               "lowbit_fused");
}

void lowbit_xperm(at::Tensor x, at::Tensor xp, int64_t bm) {
  check_cuda_contig(x, "x");
  check_cuda_contig(xp, "xp");
  TORCH_CHECK(bm == 128 || bm == 256, "xperm: bm (the build's m-tile) 128 or 256");
  TORCH_CHECK(x.dim() == 2 && xp.dim() == 2 && xp.size(0) >= x.size(0) && x.scalar_type() == xp.scalar_type() &&
                  x.element_size() == 2 && x.size(1) % 8 == 0 && xp.size(0) % bm == 0 && xp.size(1) % 128 == 0 &&
                  xp.size(1) >= x.size(1),
              "xperm: x [M, K] (K % 8 == 0) -> xp [Mp >= M, Kpad >= K] (Mp % bm == 0, Kpad % 128 == 0), 16-bit");
  check(native_lowbit_xperm(x.data_ptr(), xp.data_ptr(), (int)x.size(0), (int)xp.size(0), (int)x.size(1),
                            (int)xp.size(1), (int)bm, cur_stream()),
        "lowbit_xperm");
}

void lowbit_xsplit(at::Tensor x, at::Tensor out) {
  check_cuda_contig(x, "x");
  check_cuda_contig(out, "out");
  TORCH_CHECK(x.scalar_type() == at::kHalf && out.scalar_type() == at::kBFloat16 && out.numel() == 2 * x.numel(),
              "xsplit: f16 x -> bf16 [2 * rows]");
  check(native_lowbit_xsplit(x.data_ptr(), out.data_ptr(), (int)x.numel(), cur_stream()), "lowbit_xsplit");
}

int64_t lowbit_smem_bytes(const std::string &recipe, int64_t MX, int64_t slots, int64_t iters) {
  return native_lowbit_smem_bytes(recipe.c_str(), (int)MX, (int)slots, (int)iters);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("lowbit_gemv", &lowbit_gemv);
  m.def("lowbit_gemv_grid", &lowbit_gemv_grid);
  m.def("lowbit_lut", &lowbit_lut);
  m.def("lowbit_lut_span", &lowbit_lut_span);
  m.def("lowbit_lut_span_probe", &lowbit_lut_span_probe);
  m.def("stream_read_xor", &stream_read_xor);
  m.def("lowbit_dequant", &lowbit_dequant);
  m.def("lowbit_xsplit", &lowbit_xsplit);
  m.def("lowbit_fused_built", &lowbit_fused_built);
  m.def("lowbit_fused", &lowbit_fused);
  m.def("lowbit_xperm", &lowbit_xperm);
  m.def("lowbit_smem_bytes", &lowbit_smem_bytes);
  m.def("matmul", &matmul);
  m.def("softmax", &softmax);
  m.def("layer_norm", &layer_norm);
  m.def("calibrate", &calibrate);
}
