// The shared pass's kernel alone (tile_bench.sh builds it against a checkout's cascade_attention.cpp): one KV
// head's TILES tiles of 16 queries over BLOCKS blocks of 32 keys, D 64, bf16 cache, the values paired once per
// block as run_simd does; best of 200 runs, one thread. The peak it is measured against: 2 bf16 dot products
// (vdpbf16ps, 32 multiply-adds each) a cycle, 8.0 a ns measured on this Zen 5 with 16 independent accumulators.
#include "kern.h"
#include <chrono>
#include <cstdio>
#include <random>

constexpr int D = 64, BS = 32;

int main(int argc, char** argv) {
    const int NT = argc > 1 ? atoi(argv[1]) : 8, NB = argc > 2 ? atoi(argv[2]) : 47, reps = 200;
    std::mt19937 rng(1);
    std::normal_distribution<float> nd(0, 1);
    std::vector<uint16_t> K(size_t(NB) * BS * D), V(size_t(NB) * BS * D);
    for (auto& x : K)
        x = f32_to_bf16(nd(rng));
    for (auto& x : V)
        x = f32_to_bf16(nd(rng));
    std::vector<Tile<D>> tiles(NT);
    std::vector<float> q(D);
    alignas(64) static uint32_t vf[64 * D];
    alignas(64) static float sbuf[64 * 16];
    double best = 1e30;
    for (int r = 0; r < reps; ++r) {
        std::mt19937 qrng(2);
        for (auto& t : tiles) {
            t.clear<true>();
            for (int i = 0; i < 16; ++i) {
                for (auto& x : q)
                    x = nd(qrng);
                t.add<true>(q.data(), 0.125f, 0, INT32_MAX, 0, 0);
            }
        }
        const auto t0 = std::chrono::steady_clock::now();
        for (int b = 0; b < NB; ++b) {
            values_pairs<D>(&V[size_t(b) * BS * D], BS, 0, BS, vf);
            for (int ti = 0; ti < NT; ++ti)
                tile_block<D, true>(tiles[ti], &K[size_t(b) * BS * D], vf, BS, b * BS, sbuf);
        }
        best = std::min(best, std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    }
    const double macs = double(NT) * 16 * NB * BS * D * 2;  // Q.K and P.V
    float chk = 0;
    for (auto& t : tiles)
        chk += t.acc[0] / t.l[0];
    printf("%d tiles x %d blocks: %.1f us, %.0f GMAC/s on one thread (%.0f%% of 256), check %.5f\n", NT, NB, best,
           macs / best / 1e3, macs / best / 1e3 / 256 * 100, chk);
}
