// Times the escha CUDA kernels on their own (no ggml graph), to separate the
// decode-and-multiply kernel from the per-op launches and to compare IC
// splits (grid sizes). Includes ../escha.cu, so it times exactly the
// shipped kernels. Build and run on the GPU machine (hip/bench/run.sh).
// ESCHA_SRC: another version of escha.cu to time instead (A/B runs).
#ifndef ESCHA_SRC
#define ESCHA_SRC "../escha.cu"
#endif
#include ESCHA_SRC

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <type_traits>
#include <vector>

// ggml-cuda's launcher (escha_launch's dependent launches) asks for the
// device, which ggml-cuda.cu defines: not linked here.
int ggml_cuda_get_device() {
    int id = 0;
    CUDA_CHECK(cudaGetDevice(&id));
    return id;
}

[[noreturn]] void ggml_cuda_error(const char * stmt, const char * func, const char * file, int line, const char * msg) {
    fprintf(stderr, "CUDA error: %s\n  %s in %s at %s:%d\n", msg, stmt, func, file, line);
    exit(1);
}

// Blocks along the output tiles: an escha_divisor since the kernels divide
// by it without nvcc's division, a plain int in older sources (ESCHA_SRC).
template <typename T> static int n_x_of(const T & n) {
    if constexpr (std::is_integral_v<T>) {
        return (int) n;
    } else {
        return (int) n.d;
    }
}

// The dense one-block GEMV's tiles a warp where the plan calls an op large
// (escha_cuda_gemv_wide), and that rule; 4 and never in older sources.
#ifdef ESCHA_CUDA_HAS_GEMV_WIDE
static constexpr int bench_wide_ntw = ESCHA_CUDA_GEMV_WIDE_NTW;
static bool bench_gemv_wide(const int kt, const int nt, const int nsm) { return escha_cuda_gemv_wide(kt, nt, nsm); }
#else
static constexpr int bench_wide_ntw = 4;
static bool bench_gemv_wide(int, int, int) { return false; }
#endif

struct timer {
    cudaEvent_t a, b;
    timer() { cudaEventCreate(&a); cudaEventCreate(&b); }
    ~timer() { cudaEventDestroy(a); cudaEventDestroy(b); }
    void start() { cudaEventRecord(a); }
    float stop_ms() { cudaEventRecord(b); cudaEventSynchronize(b); float ms; cudaEventElapsedTime(&ms, a, b); return ms; }
};

// ROWS rows per block: the token-generation kernel escha_gemv_kernel<K,
// NTW, ROWS/8> (GEMV, up to 64 rows: 16 and fewer by default), else the
// prefill kernel escha_mm_kernel<K, NTW, ROWS/16>.
template <int K, int NTW, int ROWS, bool GEMV = (ROWS <= 16)>
static void (*kernel_of())(escha_mm_args) {
    if constexpr (!GEMV) {
        return escha_mm_kernel<K, NTW, ROWS / 16, true>;
    } else {
        return escha_gemv_kernel<K, NTW, ROWS / 8>;
    }
}

// A weight's code and, with ESCHA_BENCH_COLD, copies of it that make 256 MB
// in all, for timed launches to go round: a model streams its weights from
// HBM, while one weight of the 27B alone stays in the H200's 50 MB of L2.
// Owns the copies, not the code.
struct cold_code {
    std::vector<const uint32_t *> p;
    cold_code(const void * code, const size_t bytes) {
        p.push_back((const uint32_t *) code);
        const size_t n = getenv("ESCHA_BENCH_COLD") ? (256u << 20) / bytes + 1 : 1;
        for (size_t i = 1; i < n; i++) {
            void * c;
            CUDA_CHECK(cudaMalloc(&c, bytes));
            CUDA_CHECK(cudaMemcpy(c, code, bytes, cudaMemcpyDeviceToDevice));
            p.push_back((const uint32_t *) c);
        }
    }
    ~cold_code() {
        for (size_t i = 1; i < p.size(); i++) cudaFree((void *) p[i]);
    }
    const uint32_t * operator[](const int i) const { return p[i % p.size()]; }
};

template <int K, int NTW, int ROWS, bool GEMV = (ROWS <= 16)>
static float time_mm(escha_mm_args a, int ksplit, int iters, const cold_code & codes, double * checksum) {
    a.kt_chunk = (a.KT + ksplit - 1) / ksplit;
    ksplit     = (a.KT + a.kt_chunk - 1) / a.kt_chunk;
    const int n_z = (int) ((a.n_rows + ROWS - 1) / ROWS);
    const dim3 grid(n_x_of(a.n_x) * n_z, ksplit);
    void (*kernel)(escha_mm_args) = kernel_of<K, NTW, ROWS, GEMV>();
    escha_consts_fill(a.dc);
    // checksum of one clean launch
    CUDA_CHECK(cudaMemset(a.mid, 0, a.n_rows * a.OC * sizeof(float)));
    kernel<<<grid, ESCHA_THREADS>>>(a);
    std::vector<float> h(a.n_rows * a.OC);
    CUDA_CHECK(cudaMemcpy(h.data(), a.mid, h.size() * sizeof(float), cudaMemcpyDeviceToHost));
    double s = 0;
    for (float v : h) s += v;
    *checksum = s;
    for (int i = 0; i < 5; i++) kernel<<<grid, ESCHA_THREADS>>>(a);
    timer t;
    t.start();
    for (int i = 0; i < iters; i++) {
        a.code = codes[i];
        kernel<<<grid, ESCHA_THREADS>>>(a);
    }
    const float ms = t.stop_ms();
    CUDA_CHECK(cudaGetLastError());
    return ms * 1000.0f / iters;
}

template <int K, int NTW, int ROWS, bool GEMV = (ROWS <= 16)>
static void run_shape(const int IC, const int OC, const int M, const int nsm) {
    const int KT = IC / 16, NT = OC / 16;
    const size_t n_code = (size_t) KT * NT * 16 * K;
    std::mt19937 rng(42);
    std::vector<int16_t> code(n_code);
    for (auto & c : code) c = (int16_t) (rng() & 0xFFFF);
    std::vector<half> xh((size_t) M * IC);
    std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
    for (auto & v : xh) v = __float2half(uni(rng));
    int16_t * d_code; half * d_xh; float * d_mid;
    CUDA_CHECK(cudaMalloc(&d_code, n_code * 2));
    CUDA_CHECK(cudaMalloc(&d_xh, xh.size() * 2));
    CUDA_CHECK(cudaMalloc(&d_mid, (size_t) M * OC * 4));
    CUDA_CHECK(cudaMemcpy(d_code, code.data(), n_code * 2, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d_xh, xh.data(), xh.size() * 2, cudaMemcpyHostToDevice));
    const cold_code codes(d_code, n_code * 2);

    escha_mm_args a = {};
    a.code = (const uint32_t *) d_code; a.code_es = 0; a.xh = d_xh; a.mid = d_mid;
    a.KT = KT; a.NT = NT; a.IC = IC; a.OC = OC; a.n_rows = M; a.mode = 0;
    a.n_x = (NT + NTW * ESCHA_WARPS - 1) / (NTW * ESCHA_WARPS);
    const int n_z = (M + ROWS - 1) / ROWS;
    int per_sm = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel_of<K, NTW, ROWS, GEMV>(), ESCHA_THREADS, 0));
    const int blocks = n_x_of(a.n_x) * n_z;
    const int old_split = (int) std::max<int64_t>(1, std::min<int64_t>(((ROWS > 16 ? 2 : 8) * nsm + blocks - 1) / blocks, KT / 8));
    const int one_wave  = (int) std::max<int64_t>(1, std::min<int64_t>((int64_t) per_sm * nsm / blocks, KT / 8));
    const int two_waves = (int) std::max<int64_t>(1, std::min<int64_t>((int64_t) 2 * per_sm * nsm / blocks, KT / 8));
    const int shipped   = escha_cuda_ksplit((int64_t) per_sm * nsm, blocks, KT, GEMV && ROWS == 32);
    printf("K=%d IC=%d OC=%d M=%d: %d x %d blocks, %d resident per SM (%d in all); splits: first version %d, one wave %d, "
           "two waves %d, shipped %d\n", K, IC, OC, M, n_x_of(a.n_x), n_z, per_sm, per_sm * nsm, old_split, one_wave, two_waves, shipped);
    std::vector<int> splits = {old_split, one_wave, std::max(1, one_wave / 2), two_waves, shipped, one_wave * 4, std::max(1, KT / 16)};
    if (getenv("ESCHA_BENCH_SWEEP")) { // grids of half a wave to four waves, each split count once
        splits = {shipped};
        for (int f : {2, 3, 4, 5, 6, 8, 10, 12, 16}) {
            splits.push_back(std::max(1, std::min(KT / 8, one_wave * f / 4)));
        }
        std::sort(splits.begin(), splits.end());
        splits.erase(std::unique(splits.begin(), splits.end()), splits.end());
    }
    for (int ks : splits) {
        if (ks > KT / 4) continue;
        double cs;
        const float us = time_mm<K, NTW, ROWS, GEMV>(a, ks, M > 16 ? 50 : 500, codes, &cs);
        const int chunk = (KT + ks - 1) / ks;
        const int real = (KT + chunk - 1) / chunk;
        const double w = (double) IC * OC;
        printf("  split %3d (%5d blocks, %.2f waves): %8.2f us  %6.3f T weights/s (x%d rows)  %6.0f GB/s of code  checksum %.6e\n",
               real, blocks * real, (double) blocks * real / (per_sm * nsm), us, w * M / us * 1e-6, M, w * K / 8 / us * 1e-3, cs);
    }
    CUDA_CHECK(cudaFree(d_code)); CUDA_CHECK(cudaFree(d_xh)); CUDA_CHECK(cudaFree(d_mid));
}

// The three kernels of one dense op at batch 1, launched back to back as
// the op does, against the multiply alone: the per-op fixed cost.
template <int K>
static void run_op(const int IC, const int OC, const int nsm) {
    const int KT = IC / 16, NT = OC / 16;
    const size_t n_code = (size_t) KT * NT * 16 * K;
    std::vector<int16_t> code(n_code, 0x1234);
    std::vector<float> x(IC, 0.5f);
    std::vector<half> ones(std::max(IC, OC), __float2half(1.0f));
    int16_t * d_code; float * d_x; half * d_v; half * d_xh; float * d_mid; float * d_y;
    CUDA_CHECK(cudaMalloc(&d_code, n_code * 2));
    CUDA_CHECK(cudaMalloc(&d_x, IC * 4));
    CUDA_CHECK(cudaMalloc(&d_v, ones.size() * 2));
    CUDA_CHECK(cudaMalloc(&d_xh, IC * 2));
    CUDA_CHECK(cudaMalloc(&d_mid, OC * 4));
    CUDA_CHECK(cudaMalloc(&d_y, OC * 4));
    CUDA_CHECK(cudaMemcpy(d_code, code.data(), n_code * 2, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d_x, x.data(), IC * 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d_v, ones.data(), ones.size() * 2, cudaMemcpyHostToDevice));
    escha_rows rows = {};
    rows.x = (const char *) d_x; rows.nb1 = IC * 4; rows.nb2 = rows.nb1; rows.nb3 = rows.nb1;
    rows.ne1 = 1; rows.ne2 = 1; rows.nx1 = 1; rows.ids = nullptr; rows.si1 = 0;
    escha_vecs v = {};
    v.rin = d_v; v.rout = d_v;
    escha_mm_args a = {};
    a.code = (const uint32_t *) d_code; a.xh = d_xh; a.mid = d_mid;
    a.KT = KT; a.NT = NT; a.IC = IC; a.OC = OC; a.n_rows = 1; a.mode = 0;
    // The GEMV's tiles a warp as escha.cu's plan takes them at one row
    // (escha_cuda_gemv_wide), or ESCHA_BENCH_GEMV_NTW (4 or 8).
    const int ntw = getenv("ESCHA_BENCH_GEMV_NTW")            ? atoi(getenv("ESCHA_BENCH_GEMV_NTW"))
                    : bench_gemv_wide(KT, NT, nsm) ? bench_wide_ntw
                                                   : 4;
    if (ntw != 4 && ntw != 8) {
        fprintf(stderr, "ESCHA_BENCH_GEMV_NTW: 4 or 8, not %d\n", ntw);
        exit(1);
    }
    a.n_x = (NT + ntw * ESCHA_WARPS - 1) / (ntw * ESCHA_WARPS);
    a.code_early = true; // as escha.cu runs a dense op
    // The three kernels launched as escha.cu launches them (dependent
    // launches on Hopper); with ESCHA_BENCH_COLD each op reads the next copy
    // of the code.
    const cold_code codes(d_code, n_code * 2);
    auto xh = [&]() {
        escha_xh_targets t = {};
        t.t[0] = { v, d_xh, (float4 *) d_mid, (int64_t) (OC / 4) };
        escha_kernel_launch(escha_xh_kernel, dim3((IC / 128 + ESCHA_WARPS - 1) / ESCHA_WARPS, 1, 1), (cudaStream_t) 0, rows, t,
                            (int64_t) 1, IC, true);
    };
    auto out = [&]() {
        escha_kernel_launch(escha_out_kernel, dim3((OC / 128 + ESCHA_WARPS - 1) / ESCHA_WARPS, 1, 1), (cudaStream_t) 0, rows, v, d_mid,
                            d_y, (int64_t) 1, OC, true, escha_epilogue{}, escha_xh_target{});
    };
    auto mm = [&](const int i) {
        a.code = codes[i];
        if (ntw == 8) {
            escha_launch_gemv<K, 8, 1>(a, 1, 1, nsm, 0);
        } else {
            escha_launch_gemv<K, 4, 1>(a, 1, 1, nsm, 0);
        }
    };
    for (int i = 0; i < 5; i++) { xh(); mm(i); out(); }
    timer t;
    t.start();
    for (int i = 0; i < 500; i++) { xh(); mm(i); out(); }
    const float us_op = t.stop_ms() * 2.0f;
    t.start();
    for (int i = 0; i < 500; i++) mm(i);
    const float us_mm = t.stop_ms() * 2.0f;
    t.start();
    for (int i = 0; i < 500; i++) { xh(); out(); }
    const float us_tr = t.stop_ms() * 2.0f;
    CUDA_CHECK(cudaGetLastError());
    printf("op K=%d %d -> %d, batch 1, %d tiles a warp, dependent launches: whole op %.2f us, multiply alone %.2f us, both transforms alone %.2f us\n",
           K, IC, OC, ntw, us_op, us_mm, us_tr);
    CUDA_CHECK(cudaFree(d_code)); CUDA_CHECK(cudaFree(d_x)); CUDA_CHECK(cudaFree(d_v)); CUDA_CHECK(cudaFree(d_xh));
    CUDA_CHECK(cudaFree(d_mid)); CUDA_CHECK(cudaFree(d_y));
}

// A MoE decode step's experts (one token, n_used slots of n_expert
// experts): the fused one-launch GEMV as escha.cu runs the decode slots
// (PER_SLOT, input and output transform inside), back to back.
template <int K>
static void run_moe_slots(const int IC, const int OC, const int n_expert, const int n_used, const int nsm) {
    const int KT = IC / 16, NT = OC / 16;
    const size_t n_code = (size_t) KT * NT * 16 * K; // int16 per expert
    std::mt19937 rng(7);
    std::vector<int16_t> code(n_code * n_expert);
    for (auto & c : code) c = (int16_t) (rng() & 0xFFFF);
    std::vector<float> x((size_t) IC * n_used);
    std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
    for (auto & v : x) v = uni(rng);
    std::vector<half> ones((size_t) n_expert * std::max(IC, OC), __float2half(1.0f));
    // ESCHA_BENCH_COLD: the timed launches go round n_expert / n_used sets
    // of ids, every expert in one of them (37 is odd, so u * 37 + 11 visits
    // every id mod a power of two), so that their code comes from HBM as in
    // a model (one set's experts would stay in L2).
    const int n_sets = getenv("ESCHA_BENCH_COLD") ? std::max(n_expert / n_used, 1) : 1;
    std::vector<int32_t> ids((size_t) n_used * n_sets);
    for (size_t u = 0; u < ids.size(); u++) ids[u] = (int32_t) ((u * 37 + 11) % n_expert);
    int16_t * d_code; float * d_x; half * d_v; int32_t * d_ids; float * d_mid; unsigned * d_arrive; float * d_y;
    // escha.cu's plan for these slots: the fused kernel's grid (tiles a warp, blocks along the outputs)
    // ESCHA_BENCH_MOE_NTW=2: tiles a warp as GGML_ESCHA_FUSED_NTW=2 gives them
    const int ntw = getenv("ESCHA_BENCH_MOE_NTW") ? atoi(getenv("ESCHA_BENCH_MOE_NTW")) : ESCHA_CUDA_FUSED_NTW;
    const escha_cuda_plan plan = escha_cuda_make_plan(true, n_used, 1, n_expert, NT, ESCHA_WARPS, true,
                                                      ESCHA_CUDA_BLAS_MIN_ROWS, ESCHA_CUDA_FUSED_MAX_ROWS, 0, ntw);
    if (!plan.fused || plan.ntw != ntw || (ntw != 2 && ntw != 4)) {
        fprintf(stderr, "moe slots %d -> %d: the plan does not take the fused kernel at %d tiles a warp\n", IC, OC, ntw);
        exit(1);
    }
    CUDA_CHECK(cudaMalloc(&d_code, code.size() * 2));
    CUDA_CHECK(cudaMalloc(&d_x, x.size() * 4));
    CUDA_CHECK(cudaMalloc(&d_v, ones.size() * 2));
    CUDA_CHECK(cudaMalloc(&d_ids, ids.size() * 4));
    CUDA_CHECK(cudaMalloc(&d_mid, (size_t) n_used * OC * 4));
    CUDA_CHECK(cudaMalloc(&d_arrive, (size_t) n_used * (OC / 128) * 4));
    CUDA_CHECK(cudaMalloc(&d_y, (size_t) n_used * OC * 4));
    CUDA_CHECK(cudaMemcpy(d_code, code.data(), code.size() * 2, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d_x, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d_v, ones.data(), ones.size() * 2, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d_ids, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemset(d_mid, 0, (size_t) n_used * OC * 4));
    CUDA_CHECK(cudaMemset(d_arrive, 0, (size_t) n_used * (OC / 128) * 4));
    escha_rows rows = {};
    rows.x = (const char *) d_x; rows.nb1 = (int64_t) IC * 4; rows.nb2 = (int64_t) IC * 4 * n_used; rows.nb3 = 0;
    rows.ne1 = n_used; rows.ne2 = 1; rows.nx1 = n_used; rows.ids = d_ids; rows.si1 = n_used; rows.n_expert = n_expert;
    escha_vecs v = {};
    v.rin = d_v; v.rin_es = IC; v.rout = d_v; v.rout_es = OC;
    escha_mm_args a = {};
    a.code = (const uint32_t *) d_code; a.code_es = (int64_t) n_code / 2; a.mid = d_mid; a.arrive = d_arrive;
    a.rows = rows; a.v = v; a.dst = d_y;
    a.KT = KT; a.NT = NT; a.IC = IC; a.OC = OC; a.n_rows = n_used; a.mode = plan.mode;
    a.n_x = (int) plan.n_x; a.code_early = false;
    const auto launch = [&]() {
        if (ntw == 2) {
            escha_launch_gemv<K, 2, 1, true>(a, plan.n_z, plan.z_busy, nsm, 0);
        } else {
            escha_launch_gemv<K, 4, 1, true>(a, plan.n_z, plan.z_busy, nsm, 0);
        }
    };
    for (int i = 0; i < 5; i++) launch();
    timer t;
    t.start();
    for (int i = 0; i < 1000; i++) {
        a.rows.ids = d_ids + (size_t) (i % n_sets) * n_used;
        launch();
    }
    const float us = t.stop_ms();
    std::vector<float> y((size_t) n_used * OC);
    CUDA_CHECK(cudaMemcpy(y.data(), d_y, y.size() * 4, cudaMemcpyDeviceToHost));
    double cs = 0;
    for (float f : y) cs += f;
    printf("moe slots K=%d %d -> %d, %d of %d experts, %d id set(s) in turn, fused kernel at %d tiles a warp: %.2f us  cs %.6e\n", K, IC, OC,
           n_used, n_expert, n_sets, ntw, us, cs);
    CUDA_CHECK(cudaFree(d_code)); CUDA_CHECK(cudaFree(d_x)); CUDA_CHECK(cudaFree(d_v)); CUDA_CHECK(cudaFree(d_ids));
    CUDA_CHECK(cudaFree(d_mid)); CUDA_CHECK(cudaFree(d_arrive)); CUDA_CHECK(cudaFree(d_y));
}

int main() {
    cudaDeviceProp p;
    CUDA_CHECK(cudaGetDeviceProperties(&p, 0));
    const int nsm = p.multiProcessorCount;
    printf("%s, %d SMs\n", p.name, nsm);
    if (getenv("ESCHA_BENCH_MOE_SLOTS")) { // the 35B-A3B's decode slots: gate_up, down
        run_moe_slots<2>(2048, 1024, 256, 8, nsm);
        run_moe_slots<3>(512, 2048, 256, 8, nsm);
        return 0;
    }
    // One shape, for a profiler: 2 (default) or 3 at one row, 32 (a 32-row
    // block) or 64 (one 64-row block, which the plan no longer takes) rows.
    if (const char * only = getenv("ESCHA_BENCH_GEMV_ONLY")) {
        if (!strcmp(only, "64")) {
            run_shape<2, 2, 64, true>(5120, 17408, 64, nsm);
        } else if (!strcmp(only, "32")) {
            run_shape<2, 4, 32, true>(5120, 17408, 32, nsm);
        } else if (only[0] == '3') {
            run_shape<3, bench_wide_ntw, 8>(17408, 5120, 1, nsm);
        } else {
            run_shape<2, bench_wide_ntw, 8>(5120, 17408, 1, nsm);
        }
        return 0;
    }
    if (getenv("ESCHA_BENCH_OPS")) { // whole ops at one row, the 27B's shapes (escha.cu's launches and plan)
        run_op<2>(5120, 17408, nsm);
        run_op<3>(5120, 17408, nsm);
        run_op<3>(17408, 5120, nsm);
        run_op<2>(5120, 12288, nsm);
        run_op<2>(5120, 10240, nsm);
        run_op<2>(5120, 6144, nsm);
        run_op<2>(6144, 5120, nsm);
        return 0;
    }
    if (getenv("ESCHA_BENCH_27B")) { // the 27B's other projections at one row (up is K=3 at gate's shape)
        run_shape<3, bench_wide_ntw, 8>(5120, 17408, 1, nsm);
        run_shape<2, 4, 8>(5120, 12288, 1, nsm);
        run_shape<2, 4, 8>(5120, 10240, 1, nsm);
        run_shape<2, 4, 8>(5120, 6144, 1, nsm);
        run_shape<2, 4, 8>(6144, 5120, 1, nsm);
        run_shape<2, 4, 8>(5120, 1024, 1, nsm);
        return 0;
    }
    run_shape<2, bench_wide_ntw, 8>(5120, 17408, 1, nsm);
    run_shape<3, bench_wide_ntw, 8>(17408, 5120, 1, nsm);
    if (getenv("ESCHA_BENCH_NTW")) { // tile columns per warp of the GEMV, against the 8 the plan takes for these shapes up to 145 SMs
        run_shape<2, 2, 8>(5120, 17408, 1, nsm);
        run_shape<2, 4, 8>(5120, 17408, 1, nsm);
        run_shape<3, 2, 8>(17408, 5120, 1, nsm);
        run_shape<3, 4, 8>(17408, 5120, 1, nsm);
    }
    if (getenv("ESCHA_BENCH_MID")) { // 32 and 64 rows on the GEMV kernel, block shapes
        run_shape<2, 4, 32, true>(5120, 17408, 32, nsm);
        run_shape<2, 2, 64, true>(5120, 17408, 64, nsm);
        run_shape<2, 1, 64, true>(5120, 17408, 64, nsm);
        run_shape<2, 4, 32, true>(5120, 17408, 64, nsm);
        run_shape<2, 2, 32, true>(5120, 17408, 64, nsm);
        run_shape<3, 2, 64, true>(17408, 5120, 64, nsm);
        run_shape<3, 1, 64, true>(17408, 5120, 64, nsm);
        run_shape<3, 4, 32, true>(17408, 5120, 64, nsm);
        run_shape<3, 4, 32, true>(17408, 5120, 32, nsm);
        return 0;
    }
    run_shape<2, bench_wide_ntw, 8>(5120, 17408, 8, nsm);
    run_shape<2, 4, 16>(5120, 17408, 16, nsm);
    run_shape<2, 2, 64>(5120, 17408, 512, nsm);
    run_shape<3, 2, 64>(17408, 5120, 512, nsm);
    run_op<2>(5120, 17408, nsm);
    run_op<3>(17408, 5120, nsm);
    return 0;
}
