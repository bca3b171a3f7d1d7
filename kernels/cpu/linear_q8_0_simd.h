/*
 * linear_q8_0_simd.h - the q8_0 format's decode matvec and prefill matmul
 * over the packed layout "q8p16" (kernels.h "weight formats") with Q8
 * activations (seed 002: weights stay quantized, activations are int8 per
 * 32-block, the dot is an integer dot), written once over simd_<level>.h and
 * compiled per level by linear_q8_0_avx2.c and linear_q8_0_avx512.c. The
 * avx512_bf16 level (which has VNNI) replaces only the matmul
 * (linear_q8_0_avx512bf16.c, vpdpbusd).
 *
 * One 64-byte line of a panel block holds 16 rows x 4 k, so vi_dot4 against
 * a 32-bit broadcast of 4 activation bytes gives each row lane its partial
 * dot with no horizontal reduction; the 8 lines of a block sum exactly in
 * int32, then one FMA per lane applies d_w * d_x. Accuracy vs the *_ref
 * kernels: the same exact int32 block dots, FP32 scaling and sums rounded in
 * another order (fma), NMSE ~1e-14 (kcheck).
 *
 * The Q8 activation quantizer is written for AVX2 (KV_W == 8) only: it is
 * 1/rows of a projection's work, and the avx512 level inherits it.
 */
#ifndef K_SFX
#error "include kernels/cpu/simd_<level>.h first"
#endif

#define Q8_RV (16 / KV_W) /* row vectors per 16-row panel: 2 on AVX2, 1 on AVX-512 */
#define Q8_PF 2048u       /* decode prefetch distance in bytes */
#define Q8_TT (KV_W == 8 ? 4 : 8) /* prefill tokens per tile */

/* iacc[v] = the exact int32 dots of one panel block (pb) with one activation block's q. */
static inline __attribute__((always_inline)) void q8_block_dot(const uint8_t *pb, const int8_t *xq, vi *iacc)
{
    for (int v = 0; v < Q8_RV; v++) iacc[v] = vi_zero();
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) {
        vi xb = vi_bcast4(xq + 4 * j), ax = vi_abs8(xb);
#pragma GCC unroll 2
        for (int v = 0; v < Q8_RV; v++)
            iacc[v] = vi_dot4(iacc[v], vi_load(pb + 64 + 64 * j + 4 * KV_W * v), xb, ax);
    }
}

/* ---- decode: y = W x, DRAM-bound; each weight byte read once, in one stream ---- */

void K_SFX(k_matvec_q8_0)(const void *wpv, const void *xv, float *y, size_t rows, size_t cols, int ith, int nth)
{
    const k_act_q8_block *xq = xv;
    const size_t nb = cols / 32;
    size_t r0, r1;
    k_split_rows(rows, ith, nth, 16, &r0, &r1);
    const uint8_t *p = (const uint8_t *)wpv + r0 / 16 * nb * K_Q8P_BLOCK;
    for (size_t r = r0; r < r1; r += 16) {
        vf acc[Q8_RV];
        for (int v = 0; v < Q8_RV; v++) acc[v] = vf_zero();
        for (size_t b = 0; b < nb; b++, p += K_Q8P_BLOCK) {
            for (int q = 0; q < 9; q++) k_prefetch(p + Q8_PF + 64 * q);
            vi iacc[Q8_RV];
            q8_block_dot(p, xq[b].q, iacc);
            vf dx = vf_set1(xq[b].d);
            for (int v = 0; v < Q8_RV; v++)
                acc[v] = vf_fma(vf_from_vi(iacc[v]), vf_mul(vf_load((const float *)p + v * KV_W), dx), acc[v]);
        }
        for (int v = 0; v < Q8_RV; v++) vf_store(y + r + (size_t)v * KV_W, acc[v]);
    }
}

/* ---- prefill: a 16-row panel x T tokens; each block unpacked once per token tile ---- */

static inline __attribute__((always_inline)) void
q8_tile(const uint8_t *panel, size_t nb, const k_act_q8_block *xa, float *y, size_t ldy, int T, int load)
{
    vf acc[Q8_TT][Q8_RV];
    for (int t = 0; t < T; t++)
        for (int v = 0; v < Q8_RV; v++)
            acc[t][v] = load ? vf_load(y + (size_t)t * ldy + (size_t)v * KV_W) : vf_zero();
    for (size_t b = 0; b < nb; b++) {
        const uint8_t *pb = panel + b * K_Q8P_BLOCK;
        vi iacc[Q8_TT][Q8_RV];
        for (int t = 0; t < T; t++)
            for (int v = 0; v < Q8_RV; v++) iacc[t][v] = vi_zero();
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            vi w[Q8_RV];
            for (int v = 0; v < Q8_RV; v++) w[v] = vi_load(pb + 64 + 64 * j + 4 * KV_W * v);
#pragma GCC unroll 8
            for (int t = 0; t < T; t++) {
                vi xb = vi_bcast4(xa[(size_t)t * nb + b].q + 4 * j), ax = vi_abs8(xb);
                for (int v = 0; v < Q8_RV; v++) iacc[t][v] = vi_dot4(iacc[t][v], w[v], xb, ax);
            }
        }
        for (int t = 0; t < T; t++) {
            vf dx = vf_set1(xa[(size_t)t * nb + b].d);
            for (int v = 0; v < Q8_RV; v++)
                acc[t][v] = vf_fma(vf_from_vi(iacc[t][v]), vf_mul(vf_load((const float *)pb + v * KV_W), dx), acc[t][v]);
        }
    }
    for (int t = 0; t < T; t++)
        for (int v = 0; v < Q8_RV; v++) vf_store(y + (size_t)t * ldy + (size_t)v * KV_W, acc[t][v]);
}

#define Q8_CASE(n) case n: q8_tile(panel, nb, xa, y, ldy, n, load); break;

static void q8_tile_any(const uint8_t *panel, size_t nb, const k_act_q8_block *xa, float *y, size_t ldy, int T, int load)
{
    switch (T) {
        Q8_CASE(1) Q8_CASE(2) Q8_CASE(3)
#if Q8_TT > 4
        Q8_CASE(4) Q8_CASE(5) Q8_CASE(6) Q8_CASE(7)
#endif
    default: q8_tile(panel, nb, xa, y, ldy, Q8_TT, load);
    }
}
#undef Q8_CASE

/* Loop order: 16-row panel (outer: its weights leave DRAM once per call and
 * stay in L1/L2 while the token tiles pass), token tile, blocks. */
void K_SFX(k_matmul_q8_0)(const void *wpv, const void *xav, float *y, size_t rows, size_t cols,
                          size_t n_tok, int accumulate, int ith, int nth)
{
    const k_act_q8_block *xa = xav;
    const size_t nb = cols / 32;
    size_t r0, r1;
    k_split_rows(rows, ith, nth, 16, &r0, &r1);
    for (size_t r = r0; r < r1; r += 16) {
        const uint8_t *panel = (const uint8_t *)wpv + r / 16 * nb * K_Q8P_BLOCK;
        for (size_t t = 0; t < n_tok; t += Q8_TT) {
            int T = (int)(n_tok - t < Q8_TT ? n_tok - t : Q8_TT);
            q8_tile_any(panel, nb, xa + t * nb, y + t * rows + r, rows, T, accumulate);
        }
    }
}

/* ---- the Q8 activation quantizer (kernels.h k_act_q8_block), AVX2 only ---- */
#if KV_W == 8
void k_quant_q8_avx2(const float *x, void *xqv, size_t n)
{
    k_act_q8_block *xq = xqv;
    const __m256i absmask = _mm256_set1_epi32(0x7fffffff);
    const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (size_t b = 0; b < n / 32; b++) {
        __m256i v[4];
        for (int i = 0; i < 4; i++) v[i] = _mm256_castps_si256(_mm256_loadu_ps(x + 32 * b + 8 * (size_t)i));
        __m256i m = _mm256_max_epi32(_mm256_max_epi32(_mm256_and_si256(v[0], absmask), _mm256_and_si256(v[1], absmask)),
                                     _mm256_max_epi32(_mm256_and_si256(v[2], absmask), _mm256_and_si256(v[3], absmask)));
        __m128i h = _mm_max_epi32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
        h = _mm_max_epi32(h, _mm_shuffle_epi32(h, 0x4e));
        h = _mm_max_epi32(h, _mm_shuffle_epi32(h, 0xb1));
        uint32_t bits = (uint32_t)_mm_cvtsi128_si32(h);
        float amax;
        memcpy(&amax, &bits, 4);
        __m256 id = _mm256_set1_ps(amax > 1e-30f && amax < __builtin_inff() ? 127.0f / amax : 0.0f);
        __m256i q[4];
        for (int i = 0; i < 4; i++) q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_castsi256_ps(v[i]), id));
        __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
        p = _mm256_permutevar8x32_epi32(p, perm);
        _mm256_storeu_si256((__m256i *)xq[b].q, p);
        __m256i s = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), p), _mm256_set1_epi16(1));
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
        xq[b].d = amax / 127.0f;
        xq[b].sum = _mm_cvtsi128_si32(s4);
    }
}
#endif

#undef Q8_RV
#undef Q8_PF
#undef Q8_TT
