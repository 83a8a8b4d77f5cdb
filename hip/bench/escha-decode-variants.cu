// Store-pattern variants of the decode-once kernel, timed side by side on
// the 27B FFN shapes and checked bit for bit against the shipped kernel
// (itself checked against the C reference by escha-decode-check.cu), with
// the card's plain write bandwidth (cudaMemset, a uint4 store loop) as the
// roofline. Exit status 1 when a variant differs.
#include "standalone-kernels.cuh"

#include <functional>
#include <random>
#include <vector>

// Lane q of each quad ends with word j = lane j's b[q] (a 4x4 transpose in
// two xor steps), so lane q holds 8 consecutive halves of one row.
static __device__ __forceinline__ void quad_transpose(uint32_t b[4], const int lane) {
    const bool o1 = lane & 1, o2 = lane & 2;
    uint32_t s0 = o1 ? b[0] : b[1], s1 = o1 ? b[2] : b[3];
    s0 = __shfl_xor_sync(0xFFFFFFFF, s0, 1, ESCHA_LANES);
    s1 = __shfl_xor_sync(0xFFFFFFFF, s1, 1, ESCHA_LANES);
    if (o1) { b[0] = s0; b[2] = s1; } else { b[1] = s0; b[3] = s1; }
    uint32_t t0 = o2 ? b[0] : b[2], t1 = o2 ? b[1] : b[3];
    t0 = __shfl_xor_sync(0xFFFFFFFF, t0, 2, ESCHA_LANES);
    t1 = __shfl_xor_sync(0xFFFFFFFF, t1, 2, ESCHA_LANES);
    if (o2) { b[0] = t0; b[1] = t1; } else { b[2] = t0; b[3] = t1; }
}

// Stores one decoded tile (kt, nt) as 16 full 32-byte row sectors.
static __device__ __forceinline__ void store_quad(half * w, int64_t IC, int64_t kt, int64_t nt, uint32_t b[4], int lane) {
    quad_transpose(b, lane);
    const int q = lane & 3, n = lane / 4;
    uint4 * p = (uint4 *) (w + (nt * 16 + n + (q >> 1) * 8) * IC + kt * 16 + (q & 1) * 8);
    *p = make_uint4(b[0], b[1], b[2], b[3]);
}

// 1: the shipped tile order, 16-byte stores.
template <int K>
static __global__ void __launch_bounds__(ESCHA_THREADS) v_quad(const uint32_t * __restrict__ code, half * __restrict__ w, int KT, int NT, escha_consts dc) {
    const int lane = threadIdx.x % ESCHA_LANES;
    const escha_lane_bits<K> lb(lane);
    const int64_t n_tiles = (int64_t) KT * NT, warps = (int64_t) gridDim.x * ESCHA_WARPS;
    for (int64_t i = (int64_t) blockIdx.x * ESCHA_WARPS + threadIdx.x / ESCHA_LANES; i < n_tiles; i += warps) {
        uint32_t b[4];
        escha_decode_lane<K>(code + i * 8 * K, lb, dc, b);
        store_quad(w, (int64_t) KT * 16, i / NT, i % NT, b, lane);
    }
}

// 2: a block's warps take consecutive kt of one nt (the block writes 64
// contiguous halves of each of 16 rows), 16-byte stores.
template <int K>
static __global__ void __launch_bounds__(ESCHA_THREADS) v_quad_block(const uint32_t * __restrict__ code, half * __restrict__ w, int KT, int NT, escha_consts dc) {
    const int lane = threadIdx.x % ESCHA_LANES, wi = threadIdx.x / ESCHA_LANES;
    const escha_lane_bits<K> lb(lane);
    const int64_t KG = (KT + ESCHA_WARPS - 1) / ESCHA_WARPS, groups = KG * NT;
    for (int64_t g = blockIdx.x; g < groups; g += gridDim.x) {
        const int64_t nt = g % NT, kt = (g / NT) * ESCHA_WARPS + wi;
        if (kt >= KT) continue;
        uint32_t b[4];
        escha_decode_lane<K>(code + (kt * NT + nt) * 8 * K, lb, dc, b);
        store_quad(w, (int64_t) KT * 16, kt, nt, b, lane);
    }
}

// 3: a warp takes 8 consecutive kt of one nt, 16-byte stores.
template <int K>
static __global__ void __launch_bounds__(ESCHA_THREADS) v_quad_warp8(const uint32_t * __restrict__ code, half * __restrict__ w, int KT, int NT, escha_consts dc) {
    const int lane = threadIdx.x % ESCHA_LANES;
    const escha_lane_bits<K> lb(lane);
    const int64_t KG = (KT + 7) / 8, groups = KG * NT, warps = (int64_t) gridDim.x * ESCHA_WARPS;
    for (int64_t g = (int64_t) blockIdx.x * ESCHA_WARPS + threadIdx.x / ESCHA_LANES; g < groups; g += warps) {
        const int64_t nt = g % NT, k0 = (g / NT) * 8;
        const int nk = (int) min((int64_t) 8, KT - k0);
        for (int t = 0; t < nk; t++) {
            uint32_t b[4];
            escha_decode_lane<K>(code + ((k0 + t) * NT + nt) * 8 * K, lb, dc, b);
            store_quad(w, (int64_t) KT * 16, k0 + t, nt, b, lane);
        }
    }
}

// 4: the previous shipped kernel: tiles in code order, each lane storing
// its four words straight from the fragment layout (4-byte pieces of two
// rows' 32-byte sectors).
template <int K>
static __global__ void __launch_bounds__(ESCHA_THREADS) v_fragment(const uint32_t * __restrict__ code, half * __restrict__ w, int KT, int NT, escha_consts dc) {
    const int lane = threadIdx.x % ESCHA_LANES;
    const escha_lane_bits<K> lb(lane);
    const int64_t IC = (int64_t) KT * 16, n_tiles = (int64_t) KT * NT, warps = (int64_t) gridDim.x * ESCHA_WARPS;
    const int n = lane / 4, kq = (lane % 4) * 2;
    for (int64_t i = (int64_t) blockIdx.x * ESCHA_WARPS + threadIdx.x / ESCHA_LANES; i < n_tiles; i += warps) {
        uint32_t b[4];
        escha_decode_lane<K>(code + i * 8 * K, lb, dc, b);
        const int64_t kt = i / NT, nt = i % NT;
        uint32_t * lo = (uint32_t *) (w + (nt * 16 + n) * IC + kt * 16 + kq);
        uint32_t * hi = (uint32_t *) (w + (nt * 16 + n + 8) * IC + kt * 16 + kq);
        lo[0] = b[0];
        lo[4] = b[1];
        hi[0] = b[2];
        hi[4] = b[3];
    }
}

// The write roofline: uint4 stores of zeros over the weight.
static __global__ void v_write(uint4 * __restrict__ w, int64_t n) {
    for (int64_t i = (int64_t) blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t) gridDim.x * blockDim.x) {
        w[i] = make_uint4(0, 0, 0, 0);
    }
}

using fn = void (*)(const uint32_t *, half *, int, int, escha_consts);
template <int K> static fn variant(int v) {
    switch (v) {
        case 0: return escha_decode_kernel<K>;
        case 1: return v_quad<K>;
        case 2: return v_quad_block<K>;
        case 3: return v_quad_warp8<K>;
        default: return v_fragment<K>;
    }
}
static const char * names[] = { "shipped (staged rows)", "quad 16B stores", "quad, block of 4 kt", "quad, warp of 8 kt", "fragment order (previous)" };

static float time_us(const std::function<void()> & f, int iters = 50) {
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    for (int i = 0; i < 5; i++) f();
    CHECK(cudaEventRecord(a));
    for (int i = 0; i < iters; i++) f();
    CHECK(cudaEventRecord(b));
    CHECK(cudaEventSynchronize(b));
    float ms;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    return ms * 1000.0f / iters;
}

static int64_t run(int k, int64_t ic, int64_t oc) {
    const int KT = (int) (ic / 16), NT = (int) (oc / 16);
    const int64_t tiles = (int64_t) KT * NT;
    const size_t n_code = (size_t) tiles * 16 * k, nw = (size_t) ic * oc;
    std::mt19937 rng((unsigned) (1000 * k + ic + 7 * oc));
    std::vector<uint16_t> code(n_code);
    for (auto & c : code) c = (uint16_t) (rng() & 0xFFFF);
    uint16_t * d_code;
    half *d_ref, *d_w;
    CHECK(cudaMalloc(&d_code, n_code * 2));
    CHECK(cudaMalloc(&d_ref, nw * 2));
    CHECK(cudaMalloc(&d_w, nw * 2));
    CHECK(cudaMemcpy(d_code, code.data(), n_code * 2, cudaMemcpyHostToDevice));
    escha_consts dc;
    escha_consts_fill(dc);
    const uint32_t * c32 = (const uint32_t *) d_code;
    escha_decode_kernel_for(k)<<<(unsigned) escha_decode_blocks(KT, NT), ESCHA_THREADS>>>(c32, d_ref, KT, NT, dc);
    CHECK(cudaGetLastError());
    std::vector<uint16_t> ref(nw), got(nw);
    CHECK(cudaMemcpy(ref.data(), d_ref, nw * 2, cudaMemcpyDeviceToHost));
    const double bytes = (double) nw * 2 + (double) n_code * 2;
    printf("K=%d %lld -> %lld (%.1f MB written)\n", k, (long long) ic, (long long) oc, nw * 2e-6);
    float t = time_us([&] { CHECK(cudaMemsetAsync(d_w, 0, nw * 2)); });
    printf("  %-28s %8.2f us  %6.0f GB/s\n", "cudaMemset", t, nw * 2 / t * 1e-3);
    t = time_us([&] { v_write<<<132 * 16, 256>>>((uint4 *) d_w, (int64_t) (nw / 8)); });
    printf("  %-28s %8.2f us  %6.0f GB/s\n", "uint4 store loop", t, nw * 2 / t * 1e-3);
    int64_t bad_all = 0;
    for (int v = 0; v < 5; v++) {
        const int64_t KG8 = (KT + 7) / 8, KG4 = (KT + ESCHA_WARPS - 1) / ESCHA_WARPS;
        for (int per : { 1, 4, 16 }) {
            if (v == 0 && per != 1) continue;
            unsigned blocks;
            switch (v) {
                case 0: case 1: case 4: blocks = (unsigned) ((tiles + 8 * per * ESCHA_WARPS - 1) / (8 * per * ESCHA_WARPS)); break; // per x 8 tiles a warp
                case 2: blocks = (unsigned) ((KG4 * NT + 8 * per - 1) / (8 * per)); break;                                  // per x 8 groups a block
                default: blocks = (unsigned) ((KG8 * NT + per * ESCHA_WARPS - 1) / (per * ESCHA_WARPS)); break;             // per groups a warp (3)
            }
            if (v == 0) blocks = (unsigned) escha_decode_blocks(KT, NT);
            fn f = k == 2 ? variant<2>(v) : variant<3>(v);
            CHECK(cudaMemset(d_w, 0xFF, nw * 2));
            f<<<blocks, ESCHA_THREADS>>>(c32, d_w, KT, NT, dc);
            CHECK(cudaGetLastError());
            CHECK(cudaMemcpy(got.data(), d_w, nw * 2, cudaMemcpyDeviceToHost));
            int64_t bad = 0;
            for (size_t i = 0; i < nw; i++) bad += got[i] != ref[i];
            bad_all += bad;
            t = time_us([&] { f<<<blocks, ESCHA_THREADS>>>(c32, d_w, KT, NT, dc); });
            printf("  %-22s x%-3d %8.2f us  %6.0f GB/s  %7u blocks  %s\n", names[v], per, t, bytes / t * 1e-3, blocks,
                   bad ? "DIFFERS" : "bit-identical");
        }
    }
    CHECK(cudaFree(d_code));
    CHECK(cudaFree(d_ref));
    CHECK(cudaFree(d_w));
    return bad_all;
}

int main() {
    cudaDeviceProp p;
    CHECK(cudaGetDeviceProperties(&p, 0));
    printf("%s, %d SMs\n", p.name, p.multiProcessorCount);
    int64_t bad = 0;
    bad += run(2, 5120, 17408);
    bad += run(3, 17408, 5120);
    bad += run(2, 2048, 512);
    bad += run(3, 400, 272); // KT not a multiple of 8
    printf(bad ? "variants: some differ from the shipped kernel: FAIL\n" : "variants: all bit-identical to the shipped kernel\n");
    return bad ? 1 : 0;
}
