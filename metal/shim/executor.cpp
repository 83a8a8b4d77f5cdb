// executor.cpp: runs Metal compute dispatches of escha.metal (compiled as
// C++ through metal-shim.h) on the CPU, so the kernels execute for real on
// Linux.
//
// Every thread of a threadgroup is a fiber (tests/shim/fibers.h); the fibers of
// one threadgroup take turns on one OS thread and switch only where a kernel
// waits for others (simd_shuffle_xor, simdgroup_barrier, threadgroup_barrier).
// A barrier is passed only once every thread it covers (the lanes of the
// simdgroup, or the whole threadgroup) has arrived, so lock-step operations
// see exactly the values each lane contributed, and threadgroup memory is
// really shared. Threadgroup memory starts filled with NaN bit patterns, so a
// kernel that reads what nobody wrote produces NaN instead of a lucky value.
// Threadgroups of a grid run one after another.
//
// The C entry points at the end run one escha op through the same plan
// (escha-metal-plan.h) that ggml-metal encodes, for tests/metal_shim.rs.

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "fibers.h"
#include "metal-shim.h"
#include "../escha-metal-plan.h"
#include "../escha.metal"

// ---- f16 conversions (binary16 <-> binary32, round-to-nearest-even) ---------
namespace escha_shim {

float f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t) (h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1Fu;
    uint32_t man = h & 0x3FFu;
    uint32_t bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else {
            exp = 127 - 14;
            while ((man & 0x400u) == 0) {
                man <<= 1;
                exp--;
            }
            bits = sign | (exp << 23) | ((man & 0x3FFu) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7F800000u | (man ? 0x400000u | (man << 13) : 0);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
}

uint16_t f32_to_f16(float f) {
    uint32_t x;
    std::memcpy(&x, &f, sizeof x);
    const uint32_t sign = (x >> 16) & 0x8000u;
    const uint32_t ax = x & 0x7FFFFFFFu;
    if (ax >= 0x7F800000u) {
        return (uint16_t) (sign | (ax > 0x7F800000u ? 0x7E00u | ((ax >> 13) & 0x3FFu) : 0x7C00u));
    }
    if (ax >= 0x477FF000u) {
        return (uint16_t) (sign | 0x7C00u);
    }
    if (ax < 0x38800000u) {
        if (ax <= 0x33000000u) {
            return (uint16_t) sign;
        }
        const uint32_t e = ax >> 23;
        const uint32_t mant = (ax & 0x7FFFFFu) | 0x800000u;
        const uint32_t shift = 126u - e;
        uint32_t r = mant >> shift;
        const uint32_t rem = mant & ((1u << shift) - 1u);
        const uint32_t halfway = 1u << (shift - 1u);
        if (rem > halfway || (rem == halfway && (r & 1u))) {
            r++;
        }
        return (uint16_t) (sign | r);
    }
    const uint32_t r = ax - ((127u - 15u) << 23);
    uint32_t h = r >> 13;
    const uint32_t rem = r & 0x1FFFu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) {
        h++;
    }
    return (uint16_t) (sign | h);
}

// ---- threads of a threadgroup: fibers (tests/shim/fibers.h) ----------------------

namespace {

// What a thread of the current dispatch runs.
struct ThreadCtx {
    uint3 tgpig, tgpg;
    ushort lane, sg;
    float * shm;
};
typedef void (*body_fn)(const void * launch, const ThreadCtx & t);

// One threadgroup of a dispatch.
struct Group {
    std::vector<float> shm;
    body_fn body = nullptr;
    const void * launch = nullptr;
    uint3 tgpig{}, tgpg{};
};

void run_thread(void * ctx, int index) { // (`thread` is a Metal qualifier here)
    Group & g = *(Group *) ctx;
    ThreadCtx t;
    t.tgpig = g.tgpig;
    t.tgpg = g.tgpg;
    t.lane = (ushort) (index % 32);
    t.sg = (ushort) (index / 32);
    t.shm = g.shm.data();
    g.body(g.launch, t);
}

} // namespace

unsigned char * simd_slots() {
    return escha_fibers::warp_slots();
}

ushort simd_lane() {
    return (ushort) escha_fibers::lane();
}

void simd_sync() {
    escha_fibers::warp_sync();
}

void threadgroup_sync() {
    escha_fibers::group_sync();
}

// ---- dispatch of the escha kernels ---------------------------------------------

namespace {

struct Launch {
    escha_metal_args args;
    const void * buf[ESCHA_MTL_BUF_COUNT];
};

#define B(i, T) ((T) L->buf[i])

// The three dense kernels (GEMV, prefill, simdgroup-matrix) share one signature.
template <auto KERNEL>
void body_linear(const void * l, const ThreadCtx & t) {
    const Launch * L = (const Launch *) l;
    escha_metal_args a = L->args;
    KERNEL(a, B(1, const char *), B(2, const char *), B(3, const half *), B(4, const half *), B(5, const float *),
           B(6, const float *), B(7, const float *), (float *) L->buf[8], t.shm, t.tgpig, t.lane, t.sg);
}

template <int K>
void body_moe_gemv(const void * l, const ThreadCtx & t) {
    const Launch * L = (const Launch *) l;
    escha_metal_args a = L->args;
    kernel_escha_moe_gemv<K>(a, B(1, const char *), B(2, const char *), B(3, const half *), B(4, const half *),
                             B(5, const float *), B(6, const float *), B(7, const float *), (float *) L->buf[8],
                             B(9, const char *), t.shm, t.tgpig, t.lane, t.sg);
}

void body_moe_map(const void * l, const ThreadCtx & t) {
    const Launch * L = (const Launch *) l;
    escha_metal_args a = L->args;
    kernel_escha_moe_map(a, B(9, const char *), (int *) L->buf[10], t.tgpig, t.lane);
}

template <int K>
void body_moe_prefill(const void * l, const ThreadCtx & t) {
    const Launch * L = (const Launch *) l;
    escha_metal_args a = L->args;
    kernel_escha_moe_prefill<K>(a, B(1, const char *), B(2, const char *), B(3, const half *), B(4, const half *),
                                B(5, const float *), B(6, const float *), B(7, const float *), (float *) L->buf[8],
                                B(10, const int *), t.shm, t.tgpig, t.tgpg, t.lane, t.sg);
}

template <int K>
void body_decode(const void * l, const ThreadCtx & t) {
    const Launch * L = (const Launch *) l;
    escha_metal_args a = L->args;
    kernel_escha_decode<K>(a, B(1, const char *), (half *) L->buf[8], t.tgpig, t.lane);
}

#undef B

struct Entry {
    const char * name;
    body_fn fn;
};

// The library: the same names the plan asks ggml-metal for.
const Entry kLibrary[] = {
    {"kernel_escha_linear_gemv_k2", body_linear<kernel_escha_linear_gemv<2>>},
    {"kernel_escha_linear_gemv_k3", body_linear<kernel_escha_linear_gemv<3>>},
    {"kernel_escha_linear_prefill_k2", body_linear<kernel_escha_linear_prefill<2>>},
    {"kernel_escha_linear_prefill_k3", body_linear<kernel_escha_linear_prefill<3>>},
    {"kernel_escha_linear_mma_k2", body_linear<kernel_escha_linear_mma<2>>},
    {"kernel_escha_linear_mma_k3", body_linear<kernel_escha_linear_mma<3>>},
    {"kernel_escha_moe_gemv_k2", body_moe_gemv<2>},
    {"kernel_escha_moe_gemv_k3", body_moe_gemv<3>},
    {"kernel_escha_moe_map", body_moe_map},
    {"kernel_escha_moe_prefill_k2", body_moe_prefill<2>},
    {"kernel_escha_moe_prefill_k3", body_moe_prefill<3>},
    {"kernel_escha_decode_k2", body_decode<2>},
    {"kernel_escha_decode_k3", body_decode<3>},
};

body_fn find_kernel(const char * name) {
    for (const Entry & e : kLibrary) {
        if (strcmp(e.name, name) == 0) {
            return e.fn;
        }
    }
    fprintf(stderr, "escha metal shim: no kernel named %s\n", name);
    abort();
}

// Runs one dispatch: every threadgroup of the grid, one after another.
void dispatch(const escha_metal_dispatch & d, const Launch & L) {
    Group g;
    g.body = find_kernel(d.name);
    g.launch = &L;
    g.tgpg = uint3{(uint) d.tg[0], (uint) d.tg[1], (uint) d.tg[2]};
    const int nthreads = d.tptg[0] * d.tptg[1] * d.tptg[2];
    for (int z = 0; z < d.tg[2]; z++) {
        for (int y = 0; y < d.tg[1]; y++) {
            for (int x = 0; x < d.tg[0]; x++) {
                // Uninitialised threadgroup memory reads as NaN.
                g.shm.assign((d.smem + sizeof(float) - 1) / sizeof(float) + 1, NAN);
                g.tgpig = uint3{(uint) x, (uint) y, (uint) z};
                char what[128];
                snprintf(what, sizeof what, "threadgroup (%d, %d, %d) of %s", x, y, z, d.name);
                escha_fibers::run_group(nthreads, run_thread, &g, what);
            }
        }
    }
}

void run_plan(const escha_metal_plan & p, Launch & L) {
    L.args = p.args;
    for (int i = 0; i < p.n; i++) {
        dispatch(p.d[i], L); // dispatches are ordered, as with a memory barrier between them
    }
}

} // namespace

// One dispatch with the given arguments and buffers (ggml-metal-recorder.cpp).
void run_dispatch(const escha_metal_dispatch & d, const escha_metal_args & args, const void * const * bufs) {
    Launch L;
    L.args = args;
    memcpy(L.buf, bufs, sizeof L.buf);
    dispatch(d, L);
}

} // namespace escha_shim

// ---- C entry points for the tests ---------------------------------------------

using escha_shim::Launch;

extern "C" {

// Plan of a dense (moe = 0) or MoE op, for the host-side tests. `rows` is
// the row count (dense, x as [rows][ic]) or the token count (MoE, x as
// [T][nx][ic]). out: per dispatch tg[3], tptg[3], smem; names: 48 bytes per
// dispatch. Returns the number of dispatches, or -1 if the plan rejects the shape.
int escha_metal_shim_plan(int moe, int k, int64_t ic, int64_t oc, int64_t n_expert, int64_t rows, int64_t n_used,
                          int64_t nx, int path, int64_t out[14], char names[96], uint64_t * scratch,
                          escha_metal_args * args) {
    escha_metal_shape s;
    memset(&s, 0, sizeof s);
    s.moe = moe != 0;
    s.k = k;
    s.ic = ic;
    s.oc = oc;
    s.n_expert = moe ? n_expert : 1;
    s.x_ne[0] = ic;
    s.x_ne[1] = moe ? nx : rows;
    s.x_ne[2] = moe ? rows : 1;
    s.x_ne[3] = 1;
    s.x_nb[0] = 4;
    s.x_nb[1] = (uint64_t) ic * 4;
    s.x_nb[2] = s.x_nb[1] * (uint64_t) s.x_ne[1];
    s.x_nb[3] = s.x_nb[2] * (uint64_t) s.x_ne[2];
    s.n_used = moe ? n_used : 1;
    s.n_tokens = moe ? rows : 0;
    s.ids_nb1 = (uint64_t) n_used * 4;
    escha_metal_plan p;
    if (!escha_metal_make_plan(&s, path, &p)) {
        return -1;
    }
    for (int i = 0; i < p.n; i++) {
        for (int j = 0; j < 3; j++) {
            out[7 * i + j] = p.d[i].tg[j];
            out[7 * i + 3 + j] = p.d[i].tptg[j];
        }
        out[7 * i + 6] = (int64_t) p.d[i].smem;
        memcpy(names + 48 * i, p.d[i].name, 48);
    }
    *scratch = p.scratch;
    *args = p.args;
    return p.n;
}

// Dense op: x rows at x + i1*nb11 + i2*nb12 (bytes), i1 < ne11, i2 < ne12;
// y [ne12*ne11][oc] f32. rin/rout f16 bits. path: an escha_metal_path.
int escha_metal_shim_linear(int k, int64_t ic, int64_t oc, const int16_t * code, const float * x, int64_t ne11,
                            int64_t ne12, uint64_t nb11, uint64_t nb12, const uint16_t * rin, const uint16_t * rout,
                            const float * s_in, const float * s_out, const float * bias, float * y, int path) {
    escha_metal_shape s;
    memset(&s, 0, sizeof s);
    s.k = k;
    s.ic = ic;
    s.oc = oc;
    s.n_expert = 1;
    s.x_ne[0] = ic;
    s.x_ne[1] = ne11;
    s.x_ne[2] = ne12;
    s.x_ne[3] = 1;
    s.x_nb[0] = 4;
    s.x_nb[1] = nb11;
    s.x_nb[2] = nb12;
    s.x_nb[3] = nb12 * (uint64_t) ne12;
    s.n_used = 1;
    s.s_in_rows = s_in ? 1 : 0;
    s.s_out_rows = s_out ? 1 : 0;
    s.bias_rows = bias ? 1 : 0;
    escha_metal_plan p;
    if (!escha_metal_make_plan(&s, path, &p)) {
        return -1;
    }
    Launch L;
    memset(&L, 0, sizeof L);
    const void * bufs[] = {nullptr, code, x, rin, rout, s_in, s_out, bias, y, nullptr, nullptr};
    memcpy(L.buf, bufs, sizeof bufs);
    escha_shim::run_plan(p, L);
    return 0;
}

// MoE op: x [T][nx][ic], ids with `ids_stride` int32 per token (>= n_used),
// y [T][n_used][oc]; s_in/s_out/bias have *_rows rows (0 absent, 1 shared, E).
int escha_metal_shim_moe(int k, int64_t n_expert, int64_t ic, int64_t oc, const int16_t * code, const float * x,
                         int64_t nx, const int32_t * ids, int64_t ids_stride, int64_t n_used, int64_t n_tokens,
                         const uint16_t * rin, const uint16_t * rout, const float * s_in, int64_t s_in_rows,
                         const float * s_out, int64_t s_out_rows, const float * bias, int64_t bias_rows, float * y,
                         int path) {
    escha_metal_shape s;
    memset(&s, 0, sizeof s);
    s.moe = true;
    s.k = k;
    s.ic = ic;
    s.oc = oc;
    s.n_expert = n_expert;
    s.x_ne[0] = ic;
    s.x_ne[1] = nx;
    s.x_ne[2] = n_tokens;
    s.x_ne[3] = 1;
    s.x_nb[0] = 4;
    s.x_nb[1] = (uint64_t) ic * 4;
    s.x_nb[2] = s.x_nb[1] * (uint64_t) nx;
    s.x_nb[3] = s.x_nb[2] * (uint64_t) n_tokens;
    s.n_used = n_used;
    s.n_tokens = n_tokens;
    s.ids_nb1 = (uint64_t) ids_stride * 4;
    s.s_in_rows = s_in ? s_in_rows : 0;
    s.s_out_rows = s_out ? s_out_rows : 0;
    s.bias_rows = bias ? bias_rows : 0;
    escha_metal_plan p;
    if (!escha_metal_make_plan(&s, path, &p)) {
        return -1;
    }
    // On Metal the scratch lies after dst in the same allocation.
    std::vector<int32_t> scratch(p.scratch / sizeof(int32_t) + 1, -1);
    Launch L;
    memset(&L, 0, sizeof L);
    const void * bufs[] = {nullptr, code, x, rin, rout, s_in, s_out, bias, y, ids, scratch.data()};
    memcpy(L.buf, bufs, sizeof bufs);
    escha_shim::run_plan(p, L);
    return 0;
}

// W_bare [ic][oc] (f16 bits) through the decode-only kernel.
int escha_metal_shim_decode(int k, int64_t ic, int64_t oc, const int16_t * code, uint16_t * w) {
    if ((k != 2 && k != 3) || ic <= 0 || oc <= 0 || ic % 16 || oc % 16) {
        return -1;
    }
    escha_metal_dispatch d;
    escha_metal_set_dispatch(&d, "decode", k, (int) (oc / 16), (int) (ic / 16), 1, 32, 1, 0);
    Launch L;
    memset(&L, 0, sizeof L);
    L.args.k = k;
    L.args.ic = (int32_t) ic;
    L.args.oc = (int32_t) oc;
    L.buf[ESCHA_MTL_BUF_CODE] = code;
    L.buf[ESCHA_MTL_BUF_DST] = w;
    escha_shim::dispatch(d, L);
    return 0;
}

} // extern "C"
