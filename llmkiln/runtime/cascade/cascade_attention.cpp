// CascadeAttention: paged attention for llmkiln's OpenVINO runner (llmkiln/runtime/cascade_attention.py builds
// this file into an OpenVINO extension and puts the op where the PagedAttention graph has PagedAttentionExtension).
//
// Same inputs and KV cache layout as the PagedAttentionExtension nodes it replaces (the subset llmkiln feeds):
//   0 q [T, H*D] f32     1 k [T, Hkv*D] f32     2 v [T, Hkv*D] f32
//   3 key_cache, 4 value_cache [blocks, Hkv, BS, D] (bf16 or f32; written in place: the new tokens' k and v)
//   5 past_lens [S] i32  6 subsequence_begins [S+1] i32  7 block_indices [N] i32  8 block_indices_begins [S+1] i32
//   9 scale f32 scalar
// Output: [T, H*D] f32, each query token's attention over its sequence's past and its own new tokens (causal).
//
// What it does differently: sequences whose block tables start with the same cached blocks (a shared system
// prompt) are a group, and the attention of every query token of the group over those shared blocks is computed
// block by block for all of them together -- each shared key and value is read once per step and used by every
// query row (decode rows and prompt chunks alike), instead of once per sequence. The rest of each sequence (its
// own blocks and the new tokens) is attended per query token, and the two parts are merged exactly (online
// softmax: running max, sum of exponentials, weighted values; fp32 throughout). With bf16 caches the scores are
// bf16 dot products and the softmax weights are rounded to bf16 for P.V, as OpenVINO's own prefill kernels do: on
// AMX tiles where the CPU has them, else AVX-512 bf16 dot products over key pairs (AMD Zen 4/5: half the fp32 FMAs
// of P.V in fp32; 7 decodes + a 35-token prompt on a 1504-token prefix 21.2 -> 18.5 ms, bench-ov-bf16).
//
// Attribute: min_shared_tokens (a shared run shorter than this is not worth a group; 0: every run of a block).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <type_traits>
#include <vector>
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include <openvino/core/extension.hpp>
#include <openvino/core/op_extension.hpp>
#include <openvino/core/parallel.hpp>
#include <openvino/op/op.hpp>

namespace {

constexpr float kNegInf = -1e30f;  // the running max before any key (no IEEE infinities in the loops)

inline float bf16_to_f32(uint16_t x) {
    uint32_t u = uint32_t(x) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

inline uint16_t f32_to_bf16(float f) {  // round to nearest even, as OpenVINO's own conversion
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu))
        return uint16_t((u >> 16) | 0x40);  // a NaN stays a NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return uint16_t(u >> 16);
}

// exp(x) for x <= 0 (a score minus the running max), vectorizable: 2^n * p(r), |rel. error| < 2e-7.
inline float exp_neg(float x) {
    x = std::max(x, -87.0f);
    const float t = x * 1.44269504088896341f;
    const float n = std::floor(t + 0.5f);
    const float r = (t - n) * 0.693147180559945309f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    int32_t e = int32_t(n) + 127;
    uint32_t bits = uint32_t(e) << 23;
    float scale;
    std::memcpy(&scale, &bits, 4);
    return p * scale;
}

template <typename C>
inline float to_f32(C x);
template <>
inline float to_f32<float>(float x) {
    return x;
}
template <>
inline float to_f32<uint16_t>(uint16_t x) {
    return bf16_to_f32(x);
}
template <typename C>
inline C from_f32(float x);
template <>
inline float from_f32<float>(float x) {
    return x;
}
template <>
inline uint16_t from_f32<uint16_t>(float x) {
    return f32_to_bf16(x);
}

struct Shape {
    int64_t T, S, H, Hkv, G, D, BS;
};

// Running softmax state of one (query token, head): max, sum of exponentials, weighted values.
struct State {
    float m;
    float l;
    float* acc;  // D floats
};

// One block of keys/values of one KV head, converted to fp32: kt [D][BS] (transposed), v [BS][D].
template <typename C>
inline void load_block(const C* kcache, const C* vcache, const Shape& s, int64_t block, int64_t h, int64_t j0,
                       int64_t j1, float* kt, float* v) {
    const int64_t base = ((block * s.Hkv + h) * s.BS) * s.D;
    for (int64_t j = j0; j < j1; ++j) {
        const C* kr = kcache + base + j * s.D;
        const C* vr = vcache + base + j * s.D;
        for (int64_t d = 0; d < s.D; ++d) {
            kt[d * s.BS + j] = to_f32<C>(kr[d]);
            v[j * s.D + d] = to_f32<C>(vr[d]);
        }
    }
}

// Attend one query (already scaled) over keys [j0, j1) of a loaded block; updates the state.
inline void attend(const float* q, const float* kt, const float* v, const Shape& s, int64_t j0, int64_t j1,
                   State& st, float* scores) {
    const int64_t BS = s.BS, D = s.D;
    for (int64_t j = 0; j < BS; ++j)
        scores[j] = 0.0f;
    for (int64_t d = 0; d < D; ++d) {
        const float qd = q[d];
        const float* row = kt + d * BS;
        for (int64_t j = 0; j < BS; ++j)
            scores[j] += qd * row[j];
    }
    float mx = st.m;
    for (int64_t j = j0; j < j1; ++j)
        mx = std::max(mx, scores[j]);
    const float corr = exp_neg(st.m - mx);
    float sum = 0.0f;
    for (int64_t j = j0; j < j1; ++j) {
        scores[j] = exp_neg(scores[j] - mx);
        sum += scores[j];
    }
    float* acc = st.acc;
    for (int64_t d = 0; d < D; ++d)
        acc[d] *= corr;
    for (int64_t j = j0; j < j1; ++j) {
        const float p = scores[j];
        const float* vr = v + j * D;
        for (int64_t d = 0; d < D; ++d)
            acc[d] += p * vr[d];
    }
    st.l = st.l * corr + sum;
    st.m = mx;
}


#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512BF16__)
#    include <immintrin.h>
#    define LLMKILN_SIMD 1
#endif

#ifdef LLMKILN_SIMD

inline __m512 exp512(__m512 x) {  // exp(x) for x <= 0, as exp_neg
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    const __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f));
    const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 r = _mm512_mul_ps(_mm512_sub_ps(t, n), _mm512_set1_ps(0.693147180559945309f));
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}

// Up to 16 queries of one KV head, attended together (a lane each): the queries (bf16 pairs for the bf16 dot
// product, or fp32 transposed), each lane's key range [lo, hi) and running state.
template <int D>
struct Tile {
    int n = 0;
    alignas(64) uint32_t qp[D / 2 * 16];  // bf16 cache: pair p of lane i at qp[p * 16 + i]
    alignas(64) float qt[D * 16];         // f32 cache: q[d] of lane i at qt[d * 16 + i]
    alignas(64) int32_t lo[16];
    alignas(64) int32_t hi[16];
    alignas(64) float m[16];
    alignas(64) float l[16];
    alignas(64) float acc[16 * D];
    int64_t token[16];  // where each lane's result goes: query token and head
    int64_t head[16];

    // the last key position any lane attends (-1: none)
    int32_t last_key() const {
        int32_t top = 0;
        for (int i = 0; i < n; ++i)
            top = std::max(top, hi[i]);
        return top - 1;
    }

    template <bool BF16>
    void clear() {
        n = 0;
        std::fill_n(lo, 16, 0);
        std::fill_n(hi, 16, 0);  // empty lanes attend nothing
        std::fill_n(m, 16, kNegInf);
        std::fill_n(l, 16, 0.0f);
        std::fill_n(acc, 16 * D, 0.0f);
        if (BF16)
            std::fill_n(qp, D / 2 * 16, 0u);
        else
            std::fill_n(qt, D * 16, 0.0f);
    }
    template <bool BF16>
    void add(const float* q, float scale, int32_t lo_, int32_t hi_, int64_t t, int64_t h) {
        const int i = n++;
        const __m512 sc = _mm512_set1_ps(scale);
        // lane i's column: pair (or value) k at k * 16 + i
        const __m512i col = _mm512_setr_epi32(0, 16, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224, 240);
        for (int d = 0; d < D; d += 32) {
            const __m512 a = _mm512_mul_ps(_mm512_loadu_ps(q + d), sc);
            const __m512 b = _mm512_mul_ps(_mm512_loadu_ps(q + d + 16), sc);
            if constexpr (BF16) {
                // pairs d/2 .. d/2 + 15: (q[d], q[d+1]), ... rounded to nearest even as f32_to_bf16
                const __m512i pairs = (__m512i)_mm512_cvtne2ps_pbh(b, a);
                _mm512_i32scatter_epi32(&qp[(d / 2) * 16 + i], col, pairs, 4);
            } else {
                _mm512_i32scatter_ps(&qt[d * 16 + i], col, a, 4);
                _mm512_i32scatter_ps(&qt[(d + 16) * 16 + i], col, b, 4);
            }
        }
        lo[i] = lo_;
        hi[i] = hi_;
        token[i] = t;
        head[i] = h;
    }
};

// A block's values as tile_block reads them: bf16 caches as key pairs (values_pairs: P.V in bf16 dot products),
// fp32 caches in fp32 (values_f32).
template <bool BF16>
using Values = std::conditional_t<BF16, uint32_t, float>;

// exp(x) for x <= 0 to ~1e-4 relative (a degree-3 fit of 2^f on [-1/2, 1/2]; exp512's degree 6 gives ~1e-7):
// the bf16 path's weights are rounded to bf16 (2^-9) before P.V, so more digits buy nothing there.
inline __m512 exp512_bf16(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    const __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f));
    const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_sub_ps(t, n);
    __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(0.05500892922f), f, _mm512_set1_ps(0.24221098423f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.69328290224f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

// The exponentials of a tile's scores: coarse for bf16 caches (their weights go to P.V in bf16), exact for fp32.
template <bool BF16>
inline __m512 exp_scores(__m512 x) {
    if constexpr (BF16)
        return exp512_bf16(x);
    else
        return exp512(x);
}

// Two weights' rows of 16 lanes as bf16 key pairs (lane i: the even key's weight in the low half), rounded to
// nearest even as f32_to_bf16.
inline __m512i weight_pairs(__m512 even, __m512 odd) {
    alignas(64) static const uint16_t kInterleave[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
                                                         8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
    return _mm512_permutexvar_epi16(_mm512_load_si512(kInterleave), (__m512i)_mm512_cvtne2ps_pbh(odd, even));
}

// One block of BS keys (absolute positions kb..kb+BS) for a tile: kblock [BS][D] from the cache, vals the block's
// values (Values<BF16>; rows outside every lane's range zeroed), sbuf [BS][16] scratch.
// Where every lane attends the whole block (a shared pass: always) no masks are needed -- lanes past n are padding,
// whatever they compute is never read -- and the block's max is taken from the scores in registers, the bf16
// weights paired as they are computed. Partial maxima and sums keep the dependency chains short.
template <int D, bool BF16, typename C>
inline void tile_block(Tile<D>& tile, const C* kblock, const Values<BF16>* vals, int BS, int32_t kb, float* sbuf) {
    const __m512i lo = _mm512_load_si512(tile.lo);
    const __m512i hi = _mm512_load_si512(tile.hi);
    const __mmask16 lanes = __mmask16((1u << tile.n) - 1u);
    const __mmask16 whole = _mm512_cmple_epi32_mask(lo, _mm512_set1_epi32(kb)) &
                            _mm512_cmpge_epi32_mask(hi, _mm512_set1_epi32(kb + BS));
    const bool full = (lanes & ~whole) == 0;
    const __m512 mold = _mm512_load_ps(tile.m);
    __m512 m4[4] = {mold, mold, mold, mold};
    // scores, 16 keys at a time
    for (int j0 = 0; j0 < BS; j0 += 16) {
        __m512 s[16];
        for (int jj = 0; jj < 16; ++jj)
            s[jj] = _mm512_setzero_ps();
        if constexpr (BF16) {
            // one base pointer, the 16 keys at constant offsets (16 row pointers would not fit the registers)
            const uint32_t* krows = reinterpret_cast<const uint32_t*>(kblock) + j0 * (D / 2);
            for (int p = 0; p < D / 2; ++p) {
                const __m512bh qv = (__m512bh)_mm512_load_si512(&tile.qp[p * 16]);
                const uint32_t* kp = krows + p;
#pragma GCC unroll 16
                for (int jj = 0; jj < 16; ++jj)
                    s[jj] = _mm512_dpbf16_ps(s[jj], qv, (__m512bh)_mm512_set1_epi32(int(kp[jj * (D / 2)])));
            }
        } else {
            const float* krows = reinterpret_cast<const float*>(kblock) + j0 * D;
            for (int d = 0; d < D; ++d) {
                const __m512 qv = _mm512_load_ps(&tile.qt[d * 16]);
                const float* kd = krows + d;
#pragma GCC unroll 16
                for (int jj = 0; jj < 16; ++jj)
                    s[jj] = _mm512_fmadd_ps(_mm512_set1_ps(kd[jj * D]), qv, s[jj]);
            }
        }
        for (int jj = 0; jj < 16; ++jj)
            _mm512_store_ps(&sbuf[(j0 + jj) * 16], s[jj]);
        if (full)
            for (int jj = 0; jj < 16; ++jj)
                m4[jj & 3] = _mm512_max_ps(m4[jj & 3], s[jj]);
    }
    // masks (a partial block), the block's max, exponentials
    __mmask16 masks[64];
    int jfirst = 0, jlast = BS;
    if (!full) {
        for (int j = 0; j < BS; ++j) {
            const __m512i kj = _mm512_set1_epi32(kb + j);
            masks[j] = _mm512_cmple_epi32_mask(lo, kj) & _mm512_cmpgt_epi32_mask(hi, kj);
            m4[j & 3] = _mm512_mask_max_ps(m4[j & 3], masks[j], m4[j & 3], _mm512_load_ps(&sbuf[j * 16]));
        }
        while (jlast > 0 && !masks[jlast - 1])
            --jlast;
        while (jfirst < jlast && !masks[jfirst])
            ++jfirst;
    }
    const __m512 mx = _mm512_max_ps(_mm512_max_ps(m4[0], m4[1]), _mm512_max_ps(m4[2], m4[3]));
    const __m512 corr = exp_scores<BF16>(_mm512_sub_ps(mold, mx));
    __m512 s4[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    // bf16 caches: the weights rounded to bf16 (as the AMX path and OpenVINO's own kernels do) in key pairs, one
    // bf16 dot product per 16 values of d and pair of keys (half the fp32 FMAs); fp32 caches: fp32 FMAs per key
    [[maybe_unused]] alignas(64) uint32_t pp[32 * 16];  // bf16: pair jp of lane i at pp[jp * 16 + i]
    [[maybe_unused]] const int p0 = jfirst / 2, p1 = (jlast + 1) / 2;  // bf16 only
    if (BF16 && full && BS % 2 == 0) {
        for (int jp = 0; jp < BS / 2; ++jp) {
            const __m512 pe = exp_scores<BF16>(_mm512_sub_ps(_mm512_load_ps(&sbuf[2 * jp * 16]), mx));
            const __m512 po = exp_scores<BF16>(_mm512_sub_ps(_mm512_load_ps(&sbuf[(2 * jp + 1) * 16]), mx));
            s4[jp & 3] = _mm512_add_ps(s4[jp & 3], _mm512_add_ps(pe, po));
            _mm512_store_si512(&pp[jp * 16], weight_pairs(pe, po));
        }
    } else {
        for (int j = 0; j < BS; ++j) {
            __m512 p = exp_scores<BF16>(_mm512_sub_ps(_mm512_load_ps(&sbuf[j * 16]), mx));
            if (!full)
                p = _mm512_maskz_mov_ps(masks[j], p);
            s4[j & 3] = _mm512_add_ps(s4[j & 3], p);
            _mm512_store_ps(&sbuf[j * 16], p);
        }
        if constexpr (BF16)
            for (int jp = p0; jp < p1; ++jp) {
                const __m512 po = 2 * jp + 1 < BS ? _mm512_load_ps(&sbuf[(2 * jp + 1) * 16]) : _mm512_setzero_ps();
                _mm512_store_si512(&pp[jp * 16], weight_pairs(_mm512_load_ps(&sbuf[2 * jp * 16]), po));
            }
    }
    const __m512 sum = _mm512_add_ps(_mm512_add_ps(s4[0], s4[1]), _mm512_add_ps(s4[2], s4[3]));
    _mm512_store_ps(tile.m, mx);
    _mm512_store_ps(tile.l, _mm512_fmadd_ps(_mm512_load_ps(tile.l), corr, sum));
    alignas(64) float cr[16];
    _mm512_store_ps(cr, corr);
    // weighted values, RB lanes at a time with their accumulators in registers (lanes past n are padding: p = 0,
    // or, in a full block, values never read)
    constexpr int V = D / 16;
    constexpr int RB = D <= 64 ? 4 : 2;
    for (int r0 = 0; r0 < tile.n; r0 += RB) {
        __m512 a[RB][V];
#pragma GCC unroll 8
        for (int rr = 0; rr < RB; ++rr) {
            const __m512 cb = _mm512_set1_ps(cr[r0 + rr]);
#pragma GCC unroll 8
            for (int c = 0; c < V; ++c)
                a[rr][c] = _mm512_mul_ps(_mm512_load_ps(&tile.acc[(r0 + rr) * D + c * 16]), cb);
        }
        if constexpr (BF16) {
            for (int jp = p0; jp < p1; ++jp) {
                __m512bh v[V];
#pragma GCC unroll 8
                for (int c = 0; c < V; ++c)
                    v[c] = (__m512bh)_mm512_load_si512(&vals[jp * D + c * 16]);
#pragma GCC unroll 8
                for (int rr = 0; rr < RB; ++rr) {
                    const __m512bh pb = (__m512bh)_mm512_set1_epi32(int(pp[jp * 16 + r0 + rr]));
#pragma GCC unroll 8
                    for (int c = 0; c < V; ++c)
                        a[rr][c] = _mm512_dpbf16_ps(a[rr][c], pb, v[c]);
                }
            }
        } else {
            for (int j = jfirst; j < jlast; ++j) {
                __m512 v[V];
#pragma GCC unroll 8
                for (int c = 0; c < V; ++c)
                    v[c] = _mm512_load_ps(&vals[j * D + c * 16]);
#pragma GCC unroll 8
                for (int rr = 0; rr < RB; ++rr) {
                    const __m512 pb = _mm512_set1_ps(sbuf[j * 16 + r0 + rr]);
#pragma GCC unroll 8
                    for (int c = 0; c < V; ++c)
                        a[rr][c] = _mm512_fmadd_ps(pb, v[c], a[rr][c]);
                }
            }
        }
#pragma GCC unroll 8
        for (int rr = 0; rr < RB; ++rr)
#pragma GCC unroll 8
            for (int c = 0; c < V; ++c)
                _mm512_store_ps(&tile.acc[(r0 + rr) * D + c * 16], a[rr][c]);
    }
}

// The values of keys [j0, j1) of a bf16 block as key pairs for P.V in bf16 dot products: pair jp (keys 2jp, 2jp+1)
// of value d at vp[jp * D + d] (key 2jp in the low half); keys outside [j0, j1) (and past BS) zero.
template <int D>
inline void values_pairs(const uint16_t* vblock, int BS, int j0, int j1, uint32_t* vp) {
    alignas(64) static const uint16_t kLo[32] = {0, 32, 1, 33, 2,  34, 3,  35, 4,  36, 5,  37, 6,  38, 7,  39,
                                                 8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
    const __m512i lo = _mm512_load_si512(kLo);
    const __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
    for (int jp = 0; jp < (BS + 1) / 2; ++jp) {
        const int ja = 2 * jp, jb = 2 * jp + 1;
        const __mmask32 ma = ja >= j0 && ja < j1 ? ~__mmask32(0) : 0;
        const __mmask32 mb = jb >= j0 && jb < j1 && jb < BS ? ~__mmask32(0) : 0;
        for (int c = 0; c < D; c += 32) {
            const __m512i a = _mm512_maskz_loadu_epi16(ma, vblock + ja * D + c);
            const __m512i b = _mm512_maskz_loadu_epi16(mb, vblock + (jb < BS ? jb : ja) * D + c);
            _mm512_store_si512(&vp[jp * D + c], _mm512_permutex2var_epi16(a, lo, b));
            _mm512_store_si512(&vp[jp * D + c + 16], _mm512_permutex2var_epi16(a, hi, b));
        }
    }
}

// The values of keys [j0, j1) of a block in fp32 (other rows zero: p is 0 there, and 0 * garbage must stay 0).
template <int D, typename C>
inline void values_f32(const C* vblock, int BS, int j0, int j1, float* vf) {
    for (int j = 0; j < BS; ++j) {
        float* dst = vf + j * D;
        if (j < j0 || j >= j1) {
            std::fill_n(dst, D, 0.0f);
            continue;
        }
        const C* src = vblock + j * D;
        if constexpr (std::is_same<C, float>::value) {
            std::memcpy(dst, src, D * sizeof(float));
        } else {
            for (int c = 0; c < D; c += 16) {
                const __m256i h16 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + c));
                const __m512i w = _mm512_slli_epi32(_mm512_cvtepu16_epi32(h16), 16);
                _mm512_store_ps(dst + c, _mm512_castsi512_ps(w));
            }
        }
    }
}

// A block's values for tile_block (Values<BF16>): keys [j0, j1), the others zero.
template <int D, bool BF16, typename C>
inline void block_values(const C* vblock, int BS, int j0, int j1, Values<BF16>* out) {
    if constexpr (BF16)
        values_pairs<D>(vblock, BS, j0, j1, out);
    else
        values_f32<D>(vblock, BS, j0, j1, out);
}

#endif  // LLMKILN_SIMD

#if defined(LLMKILN_SIMD) && defined(__AMX_TILE__) && defined(__AMX_BF16__)
#    define LLMKILN_AMX 1
#    include <sys/syscall.h>
#    include <unistd.h>

// AMX: this thread may use the tile registers (Linux asks once per process; OpenVINO's own kernels have asked
// already where they use AMX: asking again is harmless).
inline bool amx_allowed() {
#ifdef LLMKILN_AMX_EMULATED  // a test build whose tile instructions are software (tests/runtime/amx_emulation.h)
    return true;
#else
    static const bool ok = [] {
        constexpr int ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18;
        return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
    }();
    return ok;
#endif
}

struct alignas(64) TileConfig {
    uint8_t palette;
    uint8_t start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

// Eight tiles of 16 rows x 64 bytes (fp32 16x16, bf16 16x32). A constant in memory: GCC may treat the config
// builtin's operand as unread, so a config built on the stack right before it can be optimized away (palette 0:
// every tile instruction then faults with SIGILL).
alignas(64) const TileConfig kTileConfig = {
    1, 0, {}, {64, 64, 64, 64, 64, 64, 64, 64, 0, 0, 0, 0, 0, 0, 0, 0}, {16, 16, 16, 16, 16, 16, 16, 16, 0, 0, 0, 0, 0, 0, 0, 0}};

inline void amx_configure() {
    asm volatile("" ::: "memory");
    _tile_loadconfig(&kTileConfig);
}

// 16x16 transpose of 32-bit elements (rows in r), in four rounds of pairwise interleaves.
struct TransposeIndex {
    alignas(64) int32_t lo[4][16];
    alignas(64) int32_t hi[4][16];
    TransposeIndex() {
        for (int round = 0, s = 8; s >= 1; s /= 2, ++round)
            for (int j = 0; j < 16; ++j) {
                const int k = j / (2 * s), pos = j % (2 * s);
                lo[round][j] = pos < s ? k * 2 * s + pos : 16 + k * 2 * s + pos - s;
                hi[round][j] = pos < s ? k * 2 * s + s + pos : 16 + k * 2 * s + s + pos - s;
            }
    }
};
const TransposeIndex kTransposeIndex;

inline void transpose16(__m512i r[16]) {
    for (int round = 0, s = 8; s >= 1; s /= 2, ++round) {
        const __m512i il = _mm512_load_si512(kTransposeIndex.lo[round]);
        const __m512i ih = _mm512_load_si512(kTransposeIndex.hi[round]);
        for (int i = 0; i < 16; ++i)
            if ((i / s) % 2 == 0) {
                const __m512i a = r[i], b = r[i + s];
                r[i] = _mm512_permutex2var_epi32(a, il, b);
                r[i + s] = _mm512_permutex2var_epi32(a, ih, b);
            }
    }
}

// A block's keys as the B operand of Q.K^T (4 tiles: d halves x key halves, [16 d pairs][16 keys][2] each) and its
// values as the B operand of P.V (D/16 tiles: [16 key pairs][16 d][2] each, per 16 values of d... per key half).
template <int D>
struct AmxBlock {
    alignas(64) uint16_t kb[D / 32][2][16 * 32];      // [d half][key half][pair row p][key n][2]
    alignas(64) uint16_t vb[D / 16][16 * 32];         // [d slice][key pair r][d n][2] (32 keys)
};

template <int D>
inline void amx_block(const uint16_t* k, const uint16_t* v, AmxBlock<D>& out) {
    // keys: Kd[key][pair] (32-bit) transposed per 16x16
    const uint32_t* kd = reinterpret_cast<const uint32_t*>(k);
    for (int dh = 0; dh < D / 32; ++dh)
        for (int kh = 0; kh < 2; ++kh) {
            __m512i r[16];
            for (int n = 0; n < 16; ++n)
                r[n] = _mm512_loadu_si512(kd + (kh * 16 + n) * (D / 2) + dh * 16);
            transpose16(r);
            for (int p = 0; p < 16; ++p)
                _mm512_store_si512(&out.kb[dh][kh][p * 32], r[p]);
        }
    // values: rows 2r and 2r+1 interleaved
    alignas(64) static const int16_t il[32] = {0, 32, 1, 33, 2, 34, 3, 35, 4, 36, 5, 37, 6, 38, 7, 39,
                                               8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
    const __m512i idx = _mm512_load_si512(il);
    for (int c = 0; c < D / 16; ++c)
        for (int rr = 0; rr < 16; ++rr) {
            const __m512i a = _mm512_castsi256_si512(
                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + (2 * rr) * D + c * 16)));
            const __m512i b = _mm512_castsi256_si512(
                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + (2 * rr + 1) * D + c * 16)));
            _mm512_store_si512(&out.vb[c][rr * 32], _mm512_permutex2var_epi16(a, idx, b));
        }
}

constexpr int64_t kAmxOwnBlocks = 3;  // own blocks from which a decode's own pass goes to AMX

// `nq` queries (bf16, scaled, [nq][D]) over the keys of `nb` blocks (absolute positions key0, key0 + 1, ...) on
// AMX; each query's partial state (max, sum, weighted values) out. One max per query for all the keys: no
// rescaling inside. `hi` (may be null: every key): query i sees keys [lo, hi[i]) only (causal, and a sequence's
// own keys after its shared blocks).
template <int D>
void amx_attend(const uint16_t* qbf, int64_t nq, const AmxBlock<D>* blocks, int64_t nb, float* pm, float* pl,
                float* pacc, int64_t key0 = 0, int64_t lo = 0, const int32_t* hi = nullptr) {
    const int64_t nk = nb * 32;
    thread_local std::vector<float> S;
    thread_local std::vector<uint16_t> P;
    if (S.size() < size_t(16 * nk)) {
        S.resize(16 * nk);
        P.resize(16 * nk);
    }
    alignas(64) float O[16 * 16];
    amx_configure();
    for (int64_t q0 = 0; q0 < nq; q0 += 16) {
        const int64_t n = std::min<int64_t>(16, nq - q0);
        alignas(64) uint16_t qt[16 * D];
        std::memset(qt, 0, sizeof(qt));
        std::memcpy(qt, qbf + q0 * D, n * D * sizeof(uint16_t));
        // S = Q K^T, 32 keys per block
        for (int64_t b = 0; b < nb; ++b) {
            _tile_zero(0);
            _tile_zero(1);
            for (int dh = 0; dh < D / 32; ++dh) {
                _tile_loadd(2, qt + dh * 32, D * 2);
                _tile_loadd(4, blocks[b].kb[dh][0], 64);
                _tile_loadd(5, blocks[b].kb[dh][1], 64);
                _tile_dpbf16ps(0, 2, 4);
                _tile_dpbf16ps(1, 2, 5);
            }
            _tile_stored(0, &S[b * 32], nk * 4);
            _tile_stored(1, &S[b * 32 + 16], nk * 4);
        }
        // softmax rows: max, exponentials (bf16 for P.V), sums; keys outside a query's range weigh exactly 0
        const __m512i lanes = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
        for (int64_t i = 0; i < 16; ++i) {
            float* row = &S[i * nk];
            int64_t jlo = 0, jhi = nk;
            if (hi != nullptr) {
                jlo = std::max<int64_t>(0, lo - key0);
                jhi = i < n ? std::min<int64_t>(nk, hi[q0 + i] - key0) : jlo;
            }
            const __m512i vlo = _mm512_set1_epi32(int32_t(jlo)), vhi = _mm512_set1_epi32(int32_t(jhi));
            auto valid = [&](int64_t j) {
                const __m512i idx = _mm512_add_epi32(lanes, _mm512_set1_epi32(int32_t(j)));
                return __mmask16(_mm512_cmpge_epi32_mask(idx, vlo) & _mm512_cmplt_epi32_mask(idx, vhi));
            };
            __m512 mx = _mm512_set1_ps(kNegInf);
            for (int64_t j = 0; j < nk; j += 16)
                mx = _mm512_mask_max_ps(mx, valid(j), mx, _mm512_loadu_ps(row + j));
            const float m = _mm512_reduce_max_ps(mx);
            const __m512 mv = _mm512_set1_ps(m);
            __m512 sum = _mm512_setzero_ps();
            for (int64_t j = 0; j < nk; j += 32) {
                const __m512 p0 = _mm512_maskz_mov_ps(valid(j), exp512(_mm512_sub_ps(_mm512_loadu_ps(row + j), mv)));
                const __m512 p1 =
                    _mm512_maskz_mov_ps(valid(j + 16), exp512(_mm512_sub_ps(_mm512_loadu_ps(row + j + 16), mv)));
                sum = _mm512_add_ps(sum, _mm512_add_ps(p0, p1));
                _mm512_storeu_si512(&P[i * nk + j], (__m512i)_mm512_cvtne2ps_pbh(p1, p0));
            }
            if (i < n) {
                pm[q0 + i] = m;
                pl[q0 + i] = _mm512_reduce_add_ps(sum);
            }
        }
        // O = P V, 16 values of d per tile
        for (int c = 0; c < D / 16; c += 4) {
            const int cn = std::min(4, D / 16 - c);
            _tile_zero(4);
            _tile_zero(5);
            _tile_zero(6);
            _tile_zero(7);
            for (int64_t b = 0; b < nb; ++b) {
                _tile_loadd(2, &P[b * 32], nk * 2);
                _tile_loadd(3, blocks[b].vb[c], 64);
                _tile_dpbf16ps(4, 2, 3);
                if (cn > 1) {
                    _tile_loadd(3, blocks[b].vb[c + 1], 64);
                    _tile_dpbf16ps(5, 2, 3);
                }
                if (cn > 2) {
                    _tile_loadd(3, blocks[b].vb[c + 2], 64);
                    _tile_dpbf16ps(6, 2, 3);
                }
                if (cn > 3) {
                    _tile_loadd(3, blocks[b].vb[c + 3], 64);
                    _tile_dpbf16ps(7, 2, 3);
                }
            }
            for (int cc = 0; cc < cn; ++cc) {
                switch (cc) {
                    case 0: _tile_stored(4, O, 64); break;
                    case 1: _tile_stored(5, O, 64); break;
                    case 2: _tile_stored(6, O, 64); break;
                    default: _tile_stored(7, O, 64); break;
                }
                for (int64_t i = 0; i < n; ++i)
                    std::memcpy(&pacc[(q0 + i) * D + (c + cc) * 16], &O[i * 16], 16 * sizeof(float));
            }
        }
    }
    _tile_release();
}
#endif  // AMX

// AMX tiles in use here (the build has them and the OS lets this thread use them).
inline bool amx_usable() {
#ifdef LLMKILN_AMX
    return amx_allowed();
#else
    return false;
#endif
}


struct Timing {
    double prep = 0, attn = 0, shared = 0, merge = 0, own = 0;
    long calls = 0;
    bool on = std::getenv("LLMKILN_CASCADE_TIMING") != nullptr;
    ~Timing() {
        if (on && calls)
            std::fprintf(stderr,
                         "cascade: %ld calls, prepare %.1f us, attention %.1f us (shared %.1f, merge %.1f, own %.1f) "
                         "per call\n",
                         calls, prep / calls, attn / calls, shared / calls, merge / calls, own / calls);
    }
};
Timing g_timing;
inline double now_us() {
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Group {
    std::vector<int64_t> seqs;
    int64_t blocks = 0;  // shared leading blocks
    std::vector<int64_t> rows;  // the members' query tokens
};

// What one call works on: the inputs, which sequence each token is in, and the groups of shared blocks.
template <typename C>
struct Call {
    const float* q;
    const float* k;
    const float* v;
    C* kcache;
    C* vcache;
    const int32_t* past;
    const int32_t* begins;
    const int32_t* blocks;
    const int32_t* bbegins;
    float scale;
    Shape s;
    std::vector<int32_t> seq_of;
    std::vector<Group> groups;
    std::vector<int64_t> shared_of;  // tokens of each sequence attended in its group's pass

    Call(const ov::TensorVector& in, const Shape& shape) : s(shape) {
        q = in[0].data<const float>();
        k = in[1].data<const float>();
        v = in[2].data<const float>();
        kcache = static_cast<C*>(const_cast<void*>(in[3].data()));
        vcache = static_cast<C*>(const_cast<void*>(in[4].data()));
        past = in[5].data<const int32_t>();
        begins = in[6].data<const int32_t>();
        blocks = in[7].data<const int32_t>();
        bbegins = in[8].data<const int32_t>();
        scale = *in[9].data<const float>();
    }

    int64_t block(int64_t seq, int64_t b) const {
        return blocks[bbegins[seq] + b];
    }
    const C* kblock(int64_t block, int64_t h) const {
        return kcache + (block * s.Hkv + h) * s.BS * s.D;
    }
    const C* vblock(int64_t block, int64_t h) const {
        return vcache + (block * s.Hkv + h) * s.BS * s.D;
    }

    // the new tokens' keys and values into their blocks, then the groups
    void prepare(int64_t min_shared) {
        const int64_t T = s.T, S = s.S, Hkv = s.Hkv, D = s.D, BS = s.BS;
        seq_of.assign(T, 0);
        for (int64_t i = 0; i < S; ++i)
            for (int32_t t = begins[i]; t < begins[i + 1]; ++t)
                seq_of[t] = int32_t(i);
        ov::parallel_for(T, [&](int64_t t) {
            const int64_t i = seq_of[t];
            const int64_t pos = past[i] + (t - begins[i]);
            const int64_t b = block(i, pos / BS);
            const int64_t off = pos % BS;
            for (int64_t h = 0; h < Hkv; ++h) {
                C* kd = kcache + ((b * Hkv + h) * BS + off) * D;
                C* vd = vcache + ((b * Hkv + h) * BS + off) * D;
                const float* ks = k + t * Hkv * D + h * D;
                const float* vs = v + t * Hkv * D + h * D;
                for (int64_t d = 0; d < D; ++d) {
                    kd[d] = from_f32<C>(ks[d]);
                    vd[d] = from_f32<C>(vs[d]);
                }
            }
        });
        std::map<int32_t, std::vector<int64_t>> by_first;
        for (int64_t i = 0; i < S; ++i)
            if (past[i] >= BS)
                by_first[block(i, 0)].push_back(i);
        shared_of.assign(S, 0);
        for (auto& kv : by_first) {
            const auto& members = kv.second;
            if (members.size() < 2)
                continue;
            int64_t lcp = INT64_MAX;
            for (int64_t i : members)
                lcp = std::min<int64_t>(lcp, past[i] / BS);  // full past blocks only
            for (int64_t b = 1; b < lcp; ++b)
                for (int64_t i : members)
                    if (block(i, b) != block(members[0], b)) {
                        lcp = b;
                        break;
                    }
            if (lcp * BS < std::max<int64_t>(min_shared, BS))
                continue;
            Group g;
            g.seqs = members;
            g.blocks = lcp;
            for (int64_t i : members) {
                shared_of[i] = lcp * BS;
                for (int32_t t = begins[i]; t < begins[i + 1]; ++t)
                    g.rows.push_back(t);
            }
            groups.push_back(std::move(g));
        }
    }
};

// Work items of the shared pass: (group, KV head, a chunk of its shared blocks), each with its partial states.
struct Item {
    int64_t group, h, b0, b1;
    size_t slot;  // offset of its partial states: one per (row, query head of the KV head)
};

inline std::vector<Item> shared_items(const std::vector<Group>& groups, int64_t Hkv, int64_t G, size_t& slots) {
    std::vector<Item> items;
    slots = 0;
    const int64_t nthr = std::max(1, parallel_get_max_threads());
    for (int64_t gi = 0; gi < int64_t(groups.size()); ++gi) {
        const Group& g = groups[gi];
        // two items or more for every thread, each many blocks (the rows reuse every loaded block; each item
        // sets up the group's query tiles again and leaves partial states to merge), as many items as a whole
        // number of rounds of the threads where the blocks allow (SmolLM2's 3 KV heads x 3 chunks left one of 2
        // threads 5 items and the other 4; now 3 x 2). Measured on the Zen 5, 2 threads: op time a layer, 7
        // decodes + a 100-token turn on a 1504-token prefix 940 -> 760-790 us with the own pass's units, 8
        // decodes 170 -> 150, 32 decodes 400 -> 355-362 (against 4 items a thread: 760-840, 157-164, 390)
        int64_t want = std::max<int64_t>(1, (2 * nthr + Hkv - 1) / Hkv);
        while ((Hkv * want) % nthr && want < g.blocks)
            ++want;
        const int64_t per = std::max<int64_t>(1, (g.blocks + want - 1) / want);
        for (int64_t h = 0; h < Hkv; ++h)
            for (int64_t b0 = 0; b0 < g.blocks; b0 += per) {
                items.push_back({gi, h, b0, std::min(g.blocks, b0 + per), slots});
                slots += g.rows.size() * G;
            }
    }
    return items;
}

// `f(0) .. f(n - 1)` on OpenVINO's threads, each thread a contiguous range of about the same total cost
// (`cost(k)`: work of item k). ov::parallel_for splits a range into equal counts: one prompt's dear items among
// many cheap decodes' all went to one thread. (Items handed out one by one through an atomic counter balanced
// as well but cost 30-40 us a layer more on 32 decodes: the counter's cache line crossing cores per item.)
template <typename Cost, typename F>
inline void for_each_balanced(int64_t n, const Cost& cost, const F& f) {
    if (n <= 0)
        return;
    const int nthr = int(std::min<int64_t>(n, std::max(1, parallel_get_max_threads())));
    if (nthr == 1) {
        for (int64_t k = 0; k < n; ++k)
            f(k);
        return;
    }
    int64_t total = 0;
    for (int64_t k = 0; k < n; ++k)
        total += cost(k);
    std::vector<int64_t> bounds(nthr + 1, n);
    bounds[0] = 0;
    int64_t run = 0, k = 0;
    for (int t = 1; t < nthr; ++t) {  // thread t starts where the running cost passes t/nthr of the total
        while (k < n && (run + cost(k)) * nthr <= total * t)
            run += cost(k++);
        bounds[t] = k;
    }
    ov::parallel_nt(nthr, [&](int ithr, int) {
        for (int64_t j = bounds[ithr]; j < bounds[ithr + 1]; ++j)
            f(j);
    });
}

// A unit of the own pass: sequence i's rows [r0, r1) (of its new tokens) for KV head h, and its cost (queries x
// keys).
struct OwnUnit {
    int64_t i, h, r0, r1, cost;
};

// Query rows (x the query heads of a KV head) per unit of the own pass: four AVX-512 tiles of 16, or eight AMX
// tiles (each unit converts its blocks to AMX's layout once).
constexpr int64_t kOwnUnitQueries = 64;
constexpr int64_t kOwnUnitQueriesAmx = 128;

// The own pass's units, in sequence order: every (sequence, KV head) with new tokens, a prompt's rows split so
// one long prompt's heads do not all land on one thread (7 decodes + a 100-token turn: its 3 heads were the
// whole pass's work, all on one of 2 threads). A unit's keys end at its last row's (causal): a prompt's early
// rows cost less. Cost: queries x keys, and a tile's worth for the unit itself.
template <typename C>
std::vector<OwnUnit> own_units(const C& c, int64_t G, bool amx) {
    std::vector<OwnUnit> units;
    const int64_t rows_per = std::max<int64_t>(1, (amx ? kOwnUnitQueriesAmx : kOwnUnitQueries) / G);
    for (int64_t i = 0; i < c.s.S; ++i) {
        const int64_t n = c.begins[i + 1] - c.begins[i];
        for (int64_t r0 = 0; r0 < n; r0 += rows_per) {
            const int64_t r1 = std::min(n, r0 + rows_per);
            const int64_t keys = c.past[i] + r1 - c.shared_of[i];
            for (int64_t h = 0; h < c.s.Hkv; ++h)
                units.push_back({i, h, r0, r1, (r1 - r0) * G * keys + 16 * 64});
        }
    }
    return units;
}

// Fold the items' partial states into the per-(token, head) states m, l, acc: each group's items of a KV head in
// block order, the rows of the group in parallel (one serial pass was 25-35 us a layer beside the decodes and a
// 100-token turn of SmolLM2).
inline void merge_items(const std::vector<Item>& items, const std::vector<Group>& groups, const Shape& s,
                        const std::vector<float>& pm, const std::vector<float>& pl, const std::vector<float>& pacc,
                        std::vector<float>& m, std::vector<float>& l, std::vector<float>& acc) {
    const int64_t H = s.H, G = s.G, D = s.D;
    // runs of items with the same (group, KV head): shared_items lists each one's chunks together, in order
    std::vector<std::pair<size_t, size_t>> runs;
    for (size_t k = 0; k < items.size(); ++k)
        if (k == 0 || items[k].group != items[k - 1].group || items[k].h != items[k - 1].h)
            runs.push_back({k, k + 1});
        else
            runs.back().second = k + 1;
    std::vector<std::pair<size_t, size_t>> work;  // (run, row)
    for (size_t ri = 0; ri < runs.size(); ++ri)
        for (size_t r = 0; r < groups[items[runs[ri].first].group].rows.size(); ++r)
            work.push_back({ri, r});
    const auto fold = [&](int64_t w) {
        const auto [ri, r] = work[size_t(w)];
        for (size_t k = runs[ri].first; k < runs[ri].second; ++k) {
            const Item& it = items[k];
            const int64_t t = groups[it.group].rows[r];
            for (int64_t gg = 0; gg < G; ++gg) {
                const int64_t hq = it.h * G + gg;
                const size_t slot = it.slot + r * G + gg;
                float& M = m[t * H + hq];
                float& L = l[t * H + hq];
                float* A = &acc[(t * H + hq) * D];
                const float mx = std::max(M, pm[slot]);
                const float c0 = exp_neg(M - mx), c1 = exp_neg(pm[slot] - mx);
                const float* pa = &pacc[slot * D];
                for (int64_t d = 0; d < D; ++d)
                    A[d] = A[d] * c0 + pa[d] * c1;
                L = L * c0 + pl[slot] * c1;
                M = mx;
            }
        }
    };
    int64_t fmas = 0;  // the merge's multiply-adds
    for (const Item& it : items)
        fmas += int64_t(groups[it.group].rows.size()) * G * D;
    if (fmas < 131072) {
        for (int64_t w = 0; w < int64_t(work.size()); ++w)  // a few decodes: not worth waking the threads
            fold(w);
    } else {
        ov::parallel_for(int64_t(work.size()), fold);
    }
}

template <typename C>
void run_scalar(Call<C>& c, float* out) {
    const Shape& s = c.s;
    const int64_t T = s.T, H = s.H, Hkv = s.Hkv, G = s.G, D = s.D, BS = s.BS;
    std::vector<float> m(T * H, kNegInf), l(T * H, 0.0f), acc(T * H * D, 0.0f);
    size_t slots = 0;
    const auto items = shared_items(c.groups, Hkv, G, slots);
    std::vector<float> pm(slots), pl(slots), pacc(slots * D);
    ov::parallel_for(int64_t(items.size()), [&](int64_t n) {
        const Item& it = items[n];
        const Group& g = c.groups[it.group];
        std::vector<float> kt(D * BS), vb(BS * D), sc(BS), qs(D);
        const size_t R = g.rows.size();
        for (size_t r = 0; r < R * G; ++r) {
            pm[it.slot + r] = kNegInf;
            pl[it.slot + r] = 0.0f;
            std::fill_n(&pacc[(it.slot + r) * D], D, 0.0f);
        }
        for (int64_t b = it.b0; b < it.b1; ++b) {
            load_block(c.kcache, c.vcache, s, c.block(g.seqs[0], b), it.h, 0, BS, kt.data(), vb.data());
            for (size_t r = 0; r < R; ++r) {
                const int64_t t = g.rows[r];
                for (int64_t gg = 0; gg < G; ++gg) {
                    const float* qp = c.q + t * H * D + (it.h * G + gg) * D;
                    for (int64_t d = 0; d < D; ++d)
                        qs[d] = qp[d] * c.scale;
                    const size_t slot = it.slot + r * G + gg;
                    State st{pm[slot], pl[slot], &pacc[slot * D]};
                    attend(qs.data(), kt.data(), vb.data(), s, 0, BS, st, sc.data());
                    pm[slot] = st.m;
                    pl[slot] = st.l;
                }
            }
        }
    });
    merge_items(items, c.groups, s, pm, pl, pacc, m, l, acc);
    ov::parallel_for2d(T, Hkv, [&](int64_t t, int64_t h) {
        const int64_t i = c.seq_of[t];
        const int64_t start = c.shared_of[i];
        const int64_t end = c.past[i] + (t - c.begins[i]) + 1;  // keys [start, end)
        std::vector<float> kt(D * BS), vb(BS * D), sc(BS), qs(G * D);
        for (int64_t gg = 0; gg < G; ++gg) {
            const float* qp = c.q + t * H * D + (h * G + gg) * D;
            for (int64_t d = 0; d < D; ++d)
                qs[gg * D + d] = qp[d] * c.scale;
        }
        for (int64_t b = start / BS; b * BS < end; ++b) {
            const int64_t j0 = std::max<int64_t>(start - b * BS, 0);
            const int64_t j1 = std::min<int64_t>(end - b * BS, BS);
            if (j0 > 0 || j1 < BS)
                std::fill(kt.begin(), kt.end(), 0.0f);
            load_block(c.kcache, c.vcache, s, c.block(i, b), h, j0, j1, kt.data(), vb.data());
            for (int64_t gg = 0; gg < G; ++gg) {
                const int64_t hq = h * G + gg;
                State st{m[t * H + hq], l[t * H + hq], &acc[(t * H + hq) * D]};
                attend(&qs[gg * D], kt.data(), vb.data(), s, j0, j1, st, sc.data());
                m[t * H + hq] = st.m;
                l[t * H + hq] = st.l;
            }
        }
        for (int64_t gg = 0; gg < G; ++gg) {
            const int64_t hq = h * G + gg;
            const float inv = 1.0f / l[t * H + hq];
            const float* A = &acc[(t * H + hq) * D];
            float* o = out + t * H * D + hq * D;
            for (int64_t d = 0; d < D; ++d)
                o[d] = A[d] * inv;
        }
    });
}

#ifdef LLMKILN_SIMD
template <int D, typename C>
void run_simd(Call<C>& c, float* out) {
    constexpr bool BF16 = std::is_same<C, uint16_t>::value;
    const Shape& s = c.s;
    const int64_t T = s.T, H = s.H, Hkv = s.Hkv, G = s.G, BS = s.BS;
    std::vector<float> m(T * H, kNegInf), l(T * H, 0.0f), acc(T * H * D, 0.0f);
    size_t slots = 0;
    const auto items = shared_items(c.groups, Hkv, G, slots);
    std::vector<float> pm(slots), pl(slots), pacc(slots * D);
    const double t0 = now_us();
    // the shared pass: every query (row x query head) of the group for this KV head, 16 to a tile
#ifdef LLMKILN_AMX
    if (BF16 && amx_allowed()) {
        ov::parallel_for(int64_t(items.size()), [&](int64_t n) {
            const Item& it = items[n];
            const Group& g = c.groups[it.group];
            const int64_t nq = int64_t(g.rows.size()) * G;
            thread_local std::vector<uint16_t> qbf;
            thread_local std::vector<AmxBlock<D>> blks;
            if (qbf.size() < size_t(nq * D))
                qbf.resize(nq * D);
            if (blks.size() < size_t(it.b1 - it.b0))
                blks.resize(it.b1 - it.b0);
            for (int64_t qi = 0; qi < nq; ++qi) {
                const float* qp = c.q + g.rows[qi / G] * H * D + (it.h * G + qi % G) * D;
                for (int d = 0; d < D; ++d)
                    qbf[qi * D + d] = f32_to_bf16(qp[d] * c.scale);
            }
            for (int64_t b = it.b0; b < it.b1; ++b) {
                const int64_t blk = c.block(g.seqs[0], b);
                amx_block<D>(reinterpret_cast<const uint16_t*>(c.kblock(blk, it.h)),
                             reinterpret_cast<const uint16_t*>(c.vblock(blk, it.h)), blks[b - it.b0]);
            }
            amx_attend<D>(qbf.data(), nq, blks.data(), it.b1 - it.b0, &pm[it.slot], &pl[it.slot],
                          &pacc[it.slot * D]);
        });
    } else
#endif
    ov::parallel_for(int64_t(items.size()), [&](int64_t n) {
        const Item& it = items[n];
        const Group& g = c.groups[it.group];
        const int64_t nq = int64_t(g.rows.size()) * G;
        thread_local std::vector<Tile<D>> tiles;
        const size_t ntiles = size_t((nq + 15) / 16);
        if (tiles.size() < ntiles)
            tiles.resize(ntiles);
        for (size_t ti = 0; ti < ntiles; ++ti)
            tiles[ti].template clear<BF16>();
        for (int64_t qi = 0; qi < nq; ++qi) {
            const int64_t t = g.rows[qi / G], hq = it.h * G + qi % G;
            tiles[qi / 16].template add<BF16>(c.q + t * H * D + hq * D, c.scale, 0, INT32_MAX, t, hq);
        }
        alignas(64) Values<BF16> vf[64 * D];
        alignas(64) float sbuf[64 * 16];
        for (int64_t b = it.b0; b < it.b1; ++b) {
            const int64_t blk = c.block(g.seqs[0], b);
            block_values<D, BF16>(c.vblock(blk, it.h), int(BS), 0, int(BS), vf);
            for (size_t ti = 0; ti < ntiles; ++ti)
                tile_block<D, BF16>(tiles[ti], c.kblock(blk, it.h), vf, int(BS), int32_t(b * BS), sbuf);
        }
        for (int64_t qi = 0; qi < nq; ++qi) {
            const Tile<D>& tile = tiles[qi / 16];
            const int lane = int(qi % 16);
            pm[it.slot + qi] = tile.m[lane];
            pl[it.slot + qi] = tile.l[lane];
            std::memcpy(&pacc[(it.slot + qi) * D], &tile.acc[lane * D], D * sizeof(float));
        }
    });
    const double t1 = now_us();
    merge_items(items, c.groups, s, pm, pl, pacc, m, l, acc);
    const double t2 = now_us();
    // every sequence's own keys (after its shared blocks; causal), per KV head, in units of a few tiles of its
    // rows (own_units: a prompt's rows split, so one long prompt's heads do not all land on one thread), the
    // threads' shares balanced by cost
    const auto units = own_units(c, G, BF16 && amx_usable());
    for_each_balanced(int64_t(units.size()), [&](int64_t u) { return units[u].cost; }, [&](int64_t u) {
        const OwnUnit& un = units[u];
        const int64_t i = un.i, h = un.h;
        const int64_t start = c.shared_of[i];
        const int64_t t0 = c.begins[i] + un.r0, t1 = c.begins[i] + un.r1;  // this unit's rows
        const int64_t nq = (t1 - t0) * G;
        const int64_t end = c.past[i] + un.r1;  // its last row's keys [start, end)
#ifdef LLMKILN_AMX
        const int64_t b0 = start / BS, b1 = (end + BS - 1) / BS;
        // a prompt chunk, or a decode on a long past of its own: its queries on AMX (a tile of 16 rows holds a
        // decode's few query heads too: still faster than the AVX-512 lanes below from a few blocks on)
        if (BF16 && (nq >= 16 || b1 - b0 >= kAmxOwnBlocks) && amx_allowed()) {
            thread_local std::vector<uint16_t> qbf;
            thread_local std::vector<int32_t> his;
            thread_local std::vector<float> om, ol, oacc;
            thread_local std::vector<AmxBlock<D>> blks;
            if (qbf.size() < size_t(nq * D))
                qbf.resize(nq * D);
            if (his.size() < size_t(nq)) {
                his.resize(nq);
                om.resize(nq);
                ol.resize(nq);
            }
            if (oacc.size() < size_t(nq * D))
                oacc.resize(nq * D);
            if (blks.size() < size_t(b1 - b0))
                blks.resize(b1 - b0);
            for (int64_t qi = 0; qi < nq; ++qi) {
                const int64_t t = t0 + qi / G, hq = h * G + qi % G;
                const float* qp = c.q + t * H * D + hq * D;
                for (int d = 0; d < D; ++d)
                    qbf[qi * D + d] = f32_to_bf16(qp[d] * c.scale);
                his[qi] = int32_t(c.past[i] + (t - c.begins[i]) + 1);
            }
            for (int64_t b = b0; b < b1; ++b) {
                const int64_t blk = c.block(i, b);
                amx_block<D>(reinterpret_cast<const uint16_t*>(c.kblock(blk, h)),
                             reinterpret_cast<const uint16_t*>(c.vblock(blk, h)), blks[b - b0]);
            }
            amx_attend<D>(qbf.data(), nq, blks.data(), b1 - b0, om.data(), ol.data(), oacc.data(), b0 * BS, start,
                          his.data());
            for (int64_t qi = 0; qi < nq; ++qi) {
                const int64_t t = t0 + qi / G, hq = h * G + qi % G;
                const float M = m[t * H + hq], L = l[t * H + hq];
                const float mx = std::max(M, om[qi]);
                const float c0 = exp_neg(M - mx), c1 = exp_neg(om[qi] - mx);
                const float inv = 1.0f / (L * c0 + ol[qi] * c1);
                const float* A = &acc[(t * H + hq) * D];
                const float* B = &oacc[qi * D];
                float* o = out + t * H * D + hq * D;
                for (int d = 0; d < D; ++d)
                    o[d] = (A[d] * c0 + B[d] * c1) * inv;
            }
            return;
        }
#endif
        thread_local std::vector<Tile<D>> tiles;
        const size_t ntiles = size_t((nq + 15) / 16);
        if (tiles.size() < ntiles)
            tiles.resize(ntiles);
        for (size_t ti = 0; ti < ntiles; ++ti)
            tiles[ti].template clear<BF16>();
        for (int64_t qi = 0; qi < nq; ++qi) {
            const int64_t t = t0 + qi / G, hq = h * G + qi % G;
            Tile<D>& tile = tiles[qi / 16];
            const int lane = tile.n;
            tile.template add<BF16>(c.q + t * H * D + hq * D, c.scale, int32_t(start),
                                    int32_t(c.past[i] + (t - c.begins[i]) + 1), t, hq);
            tile.m[lane] = m[t * H + hq];
            tile.l[lane] = l[t * H + hq];
            std::memcpy(&tile.acc[lane * D], &acc[(t * H + hq) * D], D * sizeof(float));
        }
        alignas(64) Values<BF16> vf[64 * D];
        alignas(64) float sbuf[64 * 16];
        for (int64_t b = start / BS; b * BS < end; ++b) {
            const int64_t blk = c.block(i, b);
            const int j0 = int(std::max<int64_t>(start - b * BS, 0));
            const int j1 = int(std::min<int64_t>(end - b * BS, BS));
            block_values<D, BF16>(c.vblock(blk, h), int(BS), j0, j1, vf);
            for (size_t ti = 0; ti < ntiles; ++ti)
                if (tiles[ti].last_key() >= b * BS)  // causal: a tile whose rows all end before the block skips it
                    tile_block<D, BF16>(tiles[ti], c.kblock(blk, h), vf, int(BS), int32_t(b * BS), sbuf);
        }
        for (size_t ti = 0; ti < ntiles; ++ti)
            for (int lane = 0, n = tiles[ti].n; lane < n; ++lane) {
                const Tile<D>& tile = tiles[ti];
                const float inv = 1.0f / tile.l[lane];
                float* o = out + tile.token[lane] * H * D + tile.head[lane] * D;
                for (int d = 0; d < D; ++d)
                    o[d] = tile.acc[lane * D + d] * inv;
            }
    });
    if (g_timing.on) {
        const double t3 = now_us();
        g_timing.shared += t1 - t0;
        g_timing.merge += t2 - t1;
        g_timing.own += t3 - t2;
    }
}
#endif


template <typename C>
void run(const ov::TensorVector& in, float* out, const Shape& s, int64_t min_shared) {
    Call<C> c(in, s);
    auto t0 = std::chrono::steady_clock::now();
    c.prepare(min_shared);
    auto t1 = std::chrono::steady_clock::now();
    struct After {
        std::chrono::steady_clock::time_point t0, t1;
        ~After() {
            if (!g_timing.on)
                return;
            auto t2 = std::chrono::steady_clock::now();
            g_timing.prep += std::chrono::duration<double, std::micro>(t1 - t0).count();
            g_timing.attn += std::chrono::duration<double, std::micro>(t2 - t1).count();
            g_timing.calls++;
        }
    } after{t0, t1};
#ifdef LLMKILN_SIMD
    if (s.BS <= 64 && s.D == 64)
        return run_simd<64, C>(c, out);
    if (s.BS <= 64 && s.D == 128)
        return run_simd<128, C>(c, out);
#endif
    run_scalar(c, out);
}

}  // namespace

class CascadeAttention : public ov::op::Op {
public:
    OPENVINO_OP("CascadeAttention", "llmkiln");

    CascadeAttention() = default;
    CascadeAttention(const ov::OutputVector& args, int64_t min_shared_tokens)
        : Op(args),
          m_min_shared_tokens(min_shared_tokens) {
        constructor_validate_and_infer_types();
    }

    void validate_and_infer_types() override {
        NODE_VALIDATION_CHECK(this, get_input_size() == 10, "CascadeAttention takes 10 inputs, got ", get_input_size());
        set_output_type(0, ov::element::f32, get_input_partial_shape(0));
    }

    std::shared_ptr<ov::Node> clone_with_new_inputs(const ov::OutputVector& args) const override {
        return std::make_shared<CascadeAttention>(args, m_min_shared_tokens);
    }

    bool visit_attributes(ov::AttributeVisitor& visitor) override {
        visitor.on_attribute("min_shared_tokens", m_min_shared_tokens);
        return true;
    }

    bool has_evaluate() const override {
        return true;
    }

    bool evaluate(ov::TensorVector& outputs, const ov::TensorVector& inputs) const override {
        const auto& qs = inputs[0].get_shape();
        const auto& cs = inputs[3].get_shape();  // [blocks, Hkv, BS, D]
        Shape s{};
        s.T = int64_t(qs[0]);
        s.S = int64_t(inputs[5].get_size());
        s.Hkv = int64_t(cs[1]);
        s.BS = int64_t(cs[2]);
        s.D = int64_t(cs[3]);
        s.H = int64_t(qs[1]) / s.D;
        s.G = s.H / s.Hkv;
        outputs[0].set_shape(qs);
        float* out = outputs[0].data<float>();
        if (s.T == 0)
            return true;
        const auto et = inputs[3].get_element_type();
        if (et == ov::element::bf16)
            run<uint16_t>(inputs, out, s, m_min_shared_tokens);
        else if (et == ov::element::f32)
            run<float>(inputs, out, s, m_min_shared_tokens);
        else
            return false;
        return true;
    }

private:
    int64_t m_min_shared_tokens = 64;
};

OPENVINO_CREATE_EXTENSIONS(std::vector<ov::Extension::Ptr>({std::make_shared<ov::OpExtension<CascadeAttention>>()}));
