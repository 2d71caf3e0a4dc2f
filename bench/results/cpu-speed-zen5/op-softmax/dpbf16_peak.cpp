// vdpbf16ps throughput on one core (README.md, "The peak"): 16 independent accumulators, the key broadcast as
// GCC writes it (mode 0: vpbroadcastd from memory, then the dot product) and folded into the instruction (mode 1:
// a {1to16} memory operand, inline assembly). g++ -O2 -march=native dpbf16_peak.cpp && ./a.out
#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <cstdint>
alignas(64) uint32_t kmem[4096];
template<int MODE>
double run(long iters){
  __m512 a[16]; for(int i=0;i<16;i++) a[i]=_mm512_set1_ps(0.f);
  __m512bh x=(__m512bh)_mm512_set1_epi32(0x3f803f80);
  const uint32_t* kp = kmem;
  auto t=std::chrono::steady_clock::now();
  for(long it=0; it<iters; ++it){
    if constexpr (MODE==0) {
      #pragma GCC unroll 16
      for(int i=0;i<16;i++) a[i]=_mm512_dpbf16_ps(a[i],x,(__m512bh)_mm512_set1_epi32(int(kp[i*32])));
    } else {
      #define E(i) __asm__("vdpbf16ps %c[off](%[p])%{1to16%}, %[x], %[a]" : [a]"+v"(a[i]) : [x]"v"(x), [p]"r"(kp), [off]"i"(i*128));
      E(0)E(1)E(2)E(3)E(4)E(5)E(6)E(7)E(8)E(9)E(10)E(11)E(12)E(13)E(14)E(15)
    }
    __asm__ volatile("" : "+r"(kp));
  }
  double s=std::chrono::duration<double>(std::chrono::steady_clock::now()-t).count();
  float r=0; for(int i=0;i<16;i++) r+=_mm512_reduce_add_ps(a[i]);
  printf("mode %d: %.2f dpbf16/ns (chk %g)\n", MODE, iters*16.0/s/1e9, r);
  return s;
}
int main(){ long n=100000000/16; for(int k=0;k<2;k++){ run<0>(n); run<1>(n);} }
