// Software AMX tiles, for testing the cascade op's AMX path on a CPU without AMX: compiled in ahead of the op's
// source (`-include`, with -mamx-tile -mamx-bf16 so the source takes its AMX path, and -DLLMKILN_AMX_EMULATED so
// it does not ask Linux for the tile state), it turns every tile intrinsic the op uses into plain C++ on a
// per-thread register file: configuration (palette 1: rows and bytes per row of each tile), loads and stores with
// a stride, zeroing, and TDPBF16PS (fp32 C[m][n] += sum over k of A[m][2k] B[k][2n] + A[m][2k+1] B[k][2n+1],
// products of bf16 pairs, accumulated in fp32 as the instruction does).
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace llmkiln_amx_emulation {

struct Tiles {
    uint8_t rows[8] = {};
    uint16_t colsb[8] = {};
    alignas(64) uint8_t data[8][16][64] = {};
};
inline thread_local Tiles tiles;

inline void loadconfig(const void* config) {
    // the 64-byte configuration: palette, start row, 14 reserved, 16 x u16 bytes per row, 16 x u8 rows
    const auto* c = static_cast<const uint8_t*>(config);
    for (int i = 0; i < 8; ++i) {
        std::memcpy(&tiles.colsb[i], c + 16 + 2 * i, 2);
        tiles.rows[i] = c[48 + i];
    }
}
inline void loadd(int t, const void* base, long stride) {
    for (int r = 0; r < tiles.rows[t]; ++r)
        std::memcpy(tiles.data[t][r], static_cast<const uint8_t*>(base) + r * stride, tiles.colsb[t]);
}
inline void stored(int t, void* base, long stride) {
    for (int r = 0; r < tiles.rows[t]; ++r)
        std::memcpy(static_cast<uint8_t*>(base) + r * stride, tiles.data[t][r], tiles.colsb[t]);
}
inline void zero(int t) {
    std::memset(tiles.data[t], 0, sizeof(tiles.data[t]));
}
inline float bf16(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    const uint32_t u = uint32_t(h) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline long dpbf16ps_calls = 0;  // read by the test through llmkiln_amx_emulated_products() (ctypes)

inline void dpbf16ps(int c, int a, int b) {
    __atomic_add_fetch(&dpbf16ps_calls, 1, __ATOMIC_RELAXED);
    const int M = tiles.rows[c], N = tiles.colsb[c] / 4, K = tiles.colsb[a] / 4;
    for (int m = 0; m < M; ++m)
        for (int n = 0; n < N; ++n) {
            float acc;
            std::memcpy(&acc, &tiles.data[c][m][n * 4], 4);
            for (int k = 0; k < K; ++k) {
                const uint8_t* x = &tiles.data[a][m][k * 4];
                const uint8_t* y = &tiles.data[b][k][n * 4];
                acc += bf16(x) * bf16(y) + bf16(x + 2) * bf16(y + 2);
            }
            std::memcpy(&tiles.data[c][m][n * 4], &acc, 4);
        }
}

}  // namespace llmkiln_amx_emulation

// How many tile products this library has computed: the test's proof that the AMX path ran.
extern "C" __attribute__((visibility("default"), used)) long llmkiln_amx_emulated_products() {
    return __atomic_load_n(&llmkiln_amx_emulation::dpbf16ps_calls, __ATOMIC_RELAXED);
}

#undef _tile_loadd
#undef _tile_stored
#undef _tile_zero
#undef _tile_dpbf16ps
// _tile_loadconfig and _tile_release are inline functions in GCC's headers: a function-like macro of the same
// name takes over every call after this point
#define _tile_loadconfig(config) llmkiln_amx_emulation::loadconfig(config)
#define _tile_release() ((void)0)
#define _tile_loadd(t, base, stride) llmkiln_amx_emulation::loadd(t, base, stride)
#define _tile_stored(t, base, stride) llmkiln_amx_emulation::stored(t, base, stride)
#define _tile_zero(t) llmkiln_amx_emulation::zero(t)
#define _tile_dpbf16ps(c, a, b) llmkiln_amx_emulation::dpbf16ps(c, a, b)
