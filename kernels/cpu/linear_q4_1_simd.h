/*
 * linear_q4_1_simd.h - the q4_1 format's (scheme affine4_gs32) decode matvec
 * and prefill matmul over the packed layout "q4p16" (kernels.h "weight
 * formats") with Q8 activations (seed 002: weights stay quantized, int8
 * activations, integer dot), written once over simd_<level>.h and compiled by
 * linear_q4_1_avx2.c and linear_q4_1_avx512.c; the avx512_bf16 level (VNNI)
 * replaces only the matmul (linear_q4_1_avx512bf16.c).
 *
 * A 64-byte line of a panel block holds two k-quads of 16 rows x 4 k as
 * nibbles: a mask gives quad j, a shift and a mask quad j + 4, already
 * unsigned, so vpmaddubsw (weights as the unsigned operand) needs no sign
 * trick. Per block and row lane: acc += dot * (d_w * d_x), then
 * acc += m_w * (d_x * sum(q_x)). Accuracy vs the *_ref kernels: exact int32
 * dots, FP32 rounded in another order (fma).
 */
#ifndef K_SFX
#error "include kernels/cpu/simd_<level>.h first"
#endif

#define Q4_RV (16 / KV_W) /* row vectors per 16-row panel */
#define Q4_PF 1536u       /* decode prefetch distance in bytes */
#define Q4_TT (KV_W == 8 ? 4 : 8)

/* iacc[v] = exact int32 dots of one panel block with one activation block. */
static inline __attribute__((always_inline)) void q4_block_dot(const uint8_t *pb, const int8_t *xq, vi *iacc)
{
    for (int v = 0; v < Q4_RV; v++) iacc[v] = vi_zero();
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        vi xlo = vi_bcast4(xq + 4 * j), xhi = vi_bcast4(xq + 4 * (j + 4));
#pragma GCC unroll 2
        for (int v = 0; v < Q4_RV; v++) {
            vi w = vi_load(pb + 128 + 64 * j + 4 * KV_W * v);
            iacc[v] = vi_dot4u(iacc[v], vi_nib_lo(w), xlo);
            iacc[v] = vi_dot4u(iacc[v], vi_nib_hi(w), xhi);
        }
    }
}

/* acc[v] += the block's scaled dot and its affine term. */
static inline __attribute__((always_inline)) void q4_scale(const uint8_t *pb, const vi *iacc, const k_act_q8_block *x, vf *acc)
{
    vf dx = vf_set1(x->d), ms = vf_set1(x->d * (float)x->sum);
    for (int v = 0; v < Q4_RV; v++) {
        acc[v] = vf_fma(vf_from_vi(iacc[v]), vf_mul(vf_load((const float *)pb + v * KV_W), dx), acc[v]);
        acc[v] = vf_fma(vf_load((const float *)(pb + 64) + v * KV_W), ms, acc[v]);
    }
}

void K_SFX(k_matvec_q4_1)(const void *wpv, const void *xv, float *y, size_t rows, size_t cols, int ith, int nth)
{
    const k_act_q8_block *xq = xv;
    const size_t nb = cols / 32;
    size_t r0, r1;
    k_split_rows(rows, ith, nth, 16, &r0, &r1);
    const uint8_t *p = (const uint8_t *)wpv + r0 / 16 * nb * K_Q4P_BLOCK;
    for (size_t r = r0; r < r1; r += 16) {
        vf acc[Q4_RV];
        for (int v = 0; v < Q4_RV; v++) acc[v] = vf_zero();
        for (size_t b = 0; b < nb; b++, p += K_Q4P_BLOCK) {
            for (int q = 0; q < 6; q++) k_prefetch(p + Q4_PF + 64 * q);
            vi iacc[Q4_RV];
            q4_block_dot(p, xq[b].q, iacc);
            q4_scale(p, iacc, &xq[b], acc);
        }
        for (int v = 0; v < Q4_RV; v++) vf_store(y + r + (size_t)v * KV_W, acc[v]);
    }
}

static inline __attribute__((always_inline)) void
q4_tile(const uint8_t *panel, size_t nb, const k_act_q8_block *xa, float *y, size_t ldy, int T, int load)
{
    vf acc[Q4_TT][Q4_RV];
    for (int t = 0; t < T; t++)
        for (int v = 0; v < Q4_RV; v++)
            acc[t][v] = load ? vf_load(y + (size_t)t * ldy + (size_t)v * KV_W) : vf_zero();
    for (size_t b = 0; b < nb; b++) {
        const uint8_t *pb = panel + b * K_Q4P_BLOCK;
        vi iacc[Q4_TT][Q4_RV];
        for (int t = 0; t < T; t++)
            for (int v = 0; v < Q4_RV; v++) iacc[t][v] = vi_zero();
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            vi wl[Q4_RV], wh[Q4_RV];
            for (int v = 0; v < Q4_RV; v++) {
                vi w = vi_load(pb + 128 + 64 * j + 4 * KV_W * v);
                wl[v] = vi_nib_lo(w);
                wh[v] = vi_nib_hi(w);
            }
#pragma GCC unroll 8
            for (int t = 0; t < T; t++) {
                const int8_t *xq = xa[(size_t)t * nb + b].q;
                vi xlo = vi_bcast4(xq + 4 * j), xhi = vi_bcast4(xq + 4 * (j + 4));
                for (int v = 0; v < Q4_RV; v++) {
                    iacc[t][v] = vi_dot4u(iacc[t][v], wl[v], xlo);
                    iacc[t][v] = vi_dot4u(iacc[t][v], wh[v], xhi);
                }
            }
        }
        for (int t = 0; t < T; t++) q4_scale(pb, iacc[t], &xa[(size_t)t * nb + b], acc[t]);
    }
    for (int t = 0; t < T; t++)
        for (int v = 0; v < Q4_RV; v++) vf_store(y + (size_t)t * ldy + (size_t)v * KV_W, acc[t][v]);
}

#define Q4_CASE(n) case n: q4_tile(panel, nb, xa, y, ldy, n, load); break;

static void q4_tile_any(const uint8_t *panel, size_t nb, const k_act_q8_block *xa, float *y, size_t ldy, int T, int load)
{
    switch (T) {
        Q4_CASE(1) Q4_CASE(2) Q4_CASE(3)
#if Q4_TT > 4
        Q4_CASE(4) Q4_CASE(5) Q4_CASE(6) Q4_CASE(7)
#endif
    default: q4_tile(panel, nb, xa, y, ldy, Q4_TT, load);
    }
}
#undef Q4_CASE

void K_SFX(k_matmul_q4_1)(const void *wpv, const void *xav, float *y, size_t rows, size_t cols,
                          size_t n_tok, int accumulate, int ith, int nth)
{
    const k_act_q8_block *xa = xav;
    const size_t nb = cols / 32;
    size_t r0, r1;
    k_split_rows(rows, ith, nth, 16, &r0, &r1);
    for (size_t r = r0; r < r1; r += 16) {
        const uint8_t *panel = (const uint8_t *)wpv + r / 16 * nb * K_Q4P_BLOCK;
        for (size_t t = 0; t < n_tok; t += Q4_TT) {
            int T = (int)(n_tok - t < Q4_TT ? n_tok - t : Q4_TT);
            q4_tile_any(panel, nb, xa + t * nb, y + t * rows + r, rows, T, accumulate);
        }
    }
}

#undef Q4_RV
#undef Q4_PF
#undef Q4_TT
