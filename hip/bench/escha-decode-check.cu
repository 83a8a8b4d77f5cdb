// The decode-once kernel (escha_decode_kernel, the BLAS path's first
// stage) on a real GPU against the C reference (ggml-escha/ref), bit for
// bit: every f16 weight of random codes, K = 2 and 3, small rectangular
// shapes and the 27B-shaped FFN weights, the grid escha.cu launches and a
// one-block grid whose warps loop over every tile. Then the kernel's time
// per call against the memory roofline (2-bit code read, f16 written).
// Needs only nvcc (no ggml build); hip/device-bench.sh decode builds and
// runs it. Exit status 1 when any weight differs.
#include "standalone-kernels.cuh"

#include <random>
#include <vector>

#include "escha_ref.h"

static void launch(int k, const uint32_t * code, half * w, int KT, int NT, unsigned blocks) {
    escha_consts dc;
    escha_consts_fill(dc);
    escha_decode_kernel_for(k)<<<blocks, ESCHA_THREADS>>>(code, w, KT, NT, dc);
}

// Returns the number of weights that differ from the reference.
static int64_t check(int k, int64_t ic, int64_t oc, bool one_block, bool timed) {
    const int KT = (int) (ic / 16), NT = (int) (oc / 16);
    const size_t n_code = (size_t) KT * NT * 16 * k;
    std::mt19937 rng((unsigned) (1000 * k + ic + 7 * oc));
    std::vector<int16_t> code(n_code);
    for (auto & c : code) {
        c = (int16_t) (rng() & 0xFFFF);
    }
    std::vector<uint16_t> want((size_t) ic * oc), got((size_t) ic * oc);
    if (escha_reconstruct(code.data(), k, ic, oc, want.data()) != ESCHA_OK) {
        fprintf(stderr, "the C reference rejected K=%d %lldx%lld\n", k, (long long) ic, (long long) oc);
        exit(2);
    }
    int16_t * d_code;
    half * d_w;
    CHECK(cudaMalloc(&d_code, n_code * 2));
    CHECK(cudaMalloc(&d_w, (size_t) ic * oc * 2));
    CHECK(cudaMemcpy(d_code, code.data(), n_code * 2, cudaMemcpyHostToDevice));
    CHECK(cudaMemset(d_w, 0xFF, (size_t) ic * oc * 2)); // NaN: a weight never written shows
    const unsigned blocks = one_block ? 1u : (unsigned) escha_decode_blocks(KT, NT);
    launch(k, (const uint32_t *) d_code, d_w, KT, NT, blocks);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpy(got.data(), d_w, got.size() * 2, cudaMemcpyDeviceToHost));
    int64_t bad = 0;
    for (int64_t r = 0; r < ic; r++) {
        for (int64_t c = 0; c < oc; c++) {
            // the kernel writes w[oc][ic], the reference [ic][oc]
            if (got[c * ic + r] != want[r * oc + c] && bad++ < 4) {
                fprintf(stderr, "  K=%d %lldx%lld input %lld output %lld: got 0x%04x, reference 0x%04x\n", k, (long long) ic,
                        (long long) oc, (long long) r, (long long) c, got[c * ic + r], want[r * oc + c]);
            }
        }
    }
    printf("decode-once K=%d %lld x %lld, %u block(s): %lld of %lld weights differ from the C reference\n", k, (long long) ic,
           (long long) oc, blocks, (long long) bad, (long long) (ic * oc));
    if (timed) {
        cudaEvent_t a, b;
        CHECK(cudaEventCreate(&a));
        CHECK(cudaEventCreate(&b));
        for (int i = 0; i < 5; i++) {
            launch(k, (const uint32_t *) d_code, d_w, KT, NT, blocks);
        }
        const int iters = 50;
        CHECK(cudaEventRecord(a));
        for (int i = 0; i < iters; i++) {
            launch(k, (const uint32_t *) d_code, d_w, KT, NT, blocks);
        }
        CHECK(cudaEventRecord(b));
        CHECK(cudaEventSynchronize(b));
        float ms;
        CHECK(cudaEventElapsedTime(&ms, a, b));
        const double us = ms * 1000.0 / iters;
        const double bytes = (double) ic * oc * 2 + (double) n_code * 2;
        printf("  time %.2f us/call: %.3f T weights/s, %.0f GB/s of memory traffic (code read + f16 written)\n", us,
               (double) ic * oc / us * 1e-6, bytes / us * 1e-3);
    }
    CHECK(cudaFree(d_code));
    CHECK(cudaFree(d_w));
    return bad;
}

int main() {
    cudaDeviceProp p;
    CHECK(cudaGetDeviceProperties(&p, 0));
    printf("%s, %d SMs\n", p.name, p.multiProcessorCount);
    int64_t bad = 0;
    for (int k : { 2, 3 }) {
        bad += check(k, 256, 384, false, false);
        bad += check(k, 384, 256, true, false);
        bad += check(k, 128, 128, false, false);
    }
    bad += check(2, 5120, 17408, false, true);
    bad += check(3, 17408, 5120, false, true);
    bad += check(2, 2048, 512, false, true); // a 35B-A3B expert
    if (bad != 0) {
        printf("decode-once: %lld weights differ from the C reference: FAIL\n", (long long) bad);
        return 1;
    }
    printf("decode-once: every weight bit-identical to the C reference\n");
    return 0;
}
