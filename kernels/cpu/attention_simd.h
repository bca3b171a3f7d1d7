/*
 * attention_simd.h - flash GQA attention walks over the paged BF16 KV
 * (kernels.h; Dao et al. 2022 online softmax), written once over
 * simd_<level>.h and compiled per level by attention_<level>.c: the chunk
 * arithmetic, the walks over the pages (chunk-major and prefetching for the
 * query vectors of one KV head, GEMM-shaped from TILE_MIN vectors on, as a
 * prefill tile brings; position-major, in address order, over a range of KV
 * heads for decode) and the constant-group dispatch.
 *
 * Positions are taken in aligned chunks: [16c, 16c + 16) cut to [p0, p1)
 * (K_ATTN_CHUNK). The kernels continue the state they are given, so a walk
 * over [0, P) split at multiples of 16 is bitwise the same walk: that is what
 * makes a token's attention independent of the round it is computed in
 * (decode, prefill tile, batch; kernels.h "row invariance"). Per chunk: every
 * K row is loaded once and dotted with all `group` query heads (group
 * accumulators in registers), the online-softmax state is updated once per
 * chunk with a vector exp, and every V row is loaded once and FMA'd into all
 * group accumulators. So the heads of a group share each K/V load. A load of
 * 2 x VF_LANES bf16 widens into its even and odd elements by a shift and a mask
 * (vf_even, vf_odd); the query and the accumulators are split the same way
 * (vf_deint), so no lane-crossing widen is needed in the inner loops.
 *
 * Accuracy vs k_flash_gqa_bf16_ref: same products, another summation order
 * and a polynomial exp (~2 ulp), and the max is taken per chunk instead of
 * per position (mathematically identical): NMSE ~1e-12 on acc/l.
 */
#ifndef K_SFX
#error "include kernels/cpu/simd_<level>.h first"
#endif

#include <math.h>

/* GCC 12 reports a[] lanes g >= G as maybe-uninitialized in the unrolled
 * constant-G copies although every loop is bounded by G: a false positive. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#define CHUNK K_ATTN_CHUNK
#define GMAX 8u /* heads per register pass; larger groups run in passes */
#define KV_STRIDE (KIPP_N_KV_HEAD * KIPP_HEAD_DIM) /* elements between positions */

#define KB (2 * VF_LANES) /* bf16 per vi load of a K/V row: one even and one odd vf (vf_even, vf_odd) */

/* Keep v in a register from here on: GCC 12 otherwise folds a reused load
 * into every FMA as a memory operand, and the loop becomes load-bound. A
 * no-op under SIMDe, whose vf is not one register. */
#ifdef KIPP_SIMDE_EMU
#define K_PIN(v) ((void)0)
#else
#define K_PIN(v) __asm__("" : "+v"(v))
#endif
#define AI inline __attribute__((always_inline))

/* The G query heads at q with each KB block split into its even and odd
 * elements (vf_deint): the lane order in which a vi load of a K row widens,
 * so a K row costs one load and two bit operations per KB elements instead of
 * two zero-extending shuffles and two shifts. */
static AI void q_split(const float *q, size_t G, float qs[GMAX][KIPP_HEAD_DIM])
{
#pragma GCC unroll 8
    for (size_t g = 0; g < G; g++)
        for (size_t d = 0; d < KIPP_HEAD_DIM; d += KB) {
            vf e, o;
            vf_deint(vf_load(q + g * KIPP_HEAD_DIM + d), vf_load(q + g * KIPP_HEAD_DIM + d + VF_LANES), &e, &o);
            vf_store(qs[g] + d, e);
            vf_store(qs[g] + d + VF_LANES, o);
        }
}

/* P positions' scores against all G heads (P * G <= 8 independent FMA chains,
 * enough to cover the FMA latency; one position per step left only G chains
 * and ran latency-bound). s[g][j0 + i] for i < P; qs from q_split. */
static AI void scores_step(const float qs[GMAX][KIPP_HEAD_DIM], size_t G, size_t P, const kipp_bf16 *kr, size_t j0,
                           float scale, float s[GMAX][CHUNK])
{
    vf a[8]; /* index & 7: P * G <= 8 always; the mask only tells the compiler */
#pragma GCC unroll 8
    for (size_t i = 0; i < 8; i++) a[i] = vf_zero();
    for (size_t d = 0; d < KIPP_HEAD_DIM; d += KB) {
#pragma GCC unroll 4
        for (size_t i = 0; i < P; i++) {
            vi kv = vi_load(kr + i * KV_STRIDE + d);
            vf ke = vf_even(kv), ko = vf_odd(kv);
#pragma GCC unroll 8
            for (size_t g = 0; g < G; g++) {
                a[(i * G + g) & 7] = vf_fma(vf_load(qs[g] + d), ke, a[(i * G + g) & 7]);
                a[(i * G + g) & 7] = vf_fma(vf_load(qs[g] + d + VF_LANES), ko, a[(i * G + g) & 7]);
            }
        }
    }
#pragma GCC unroll 4
    for (size_t i = 0; i < P; i++)
#pragma GCC unroll 8
        for (size_t g = 0; g < G; g++) s[g][j0 + i] = vf_hsum(a[(i * G + g) & 7]) * scale;
}

/* s[g][j] = scale * q_g . k_j for j < n, g < G (G <= GMAX); rows at kbase + j*stride. */
static AI void chunk_scores(const float qs[GMAX][KIPP_HEAD_DIM], size_t G, const kipp_bf16 *kbase, size_t n,
                            float scale, float s[GMAX][CHUNK])
{
    const size_t P = G <= 2 ? 4 : G <= 4 ? 2 : 1;
    size_t j = 0;
    for (; j + P <= n; j += P) scores_step(qs, G, P, kbase + j * KV_STRIDE, j, scale, s);
    for (; j < n; j++) scores_step(qs, G, 1, kbase + j * KV_STRIDE, j, scale, s);
}

/* vf_exp of one float: the correction factors use the vector exp, so
 * tile_softmax's vector of them is bitwise chunk_softmax's. */
static AI float exp1(float x)
{
    float r[VF_LANES];
    vf_store(r, vf_exp(vf_set1(x)));
    return r[0];
}

/* Online-softmax step for one head: turns s[0..n) into weights e (in place;
 * s[n..CHUNK) become 0), returns the factor that rescales the old l and acc.
 * Short chunks are padded with -inf, whose exp is exactly 0 (vf_exp). */
static float chunk_softmax(float *s, size_t n, float *m, float *l)
{
    for (size_t j = n; j < CHUNK; j++) s[j] = -INFINITY;
    vf mx_v = vf_load(s);
    for (size_t j = VF_LANES; j < CHUNK; j += VF_LANES) mx_v = vf_max(mx_v, vf_load(s + j));
    float cm = vf_hmax(mx_v), mx = cm > *m ? cm : *m;
    const vf vm = vf_set1(mx);
    float corr = exp1(*m - mx); /* -inf - mx gives 0 */
    vf sum = vf_zero();
    for (size_t j = 0; j < CHUNK; j += VF_LANES) {
        vf e = vf_exp(vf_sub(vf_load(s + j), vm));
        vf_store(s + j, e);
        sum = vf_add(sum, e);
    }
    float lc = *l * corr; /* two statements: never contracted to an FMA, as tile_softmax's vf_mul, vf_add */
    *l = lc + vf_hsum(sum);
    *m = mx;
    return corr;
}

/* acc[g] = acc[g] * corr[g] + sum_j e[g][j] * v_j for H heads and SB KB-wide
 * blocks of the head at once (2 * SB * H <= 8 chains, as in chunk_scores).
 * The accumulators hold each block's even and odd elements (vf_deint), the
 * order a vi load of a V row widens in; every element still sees the same
 * multiply and FMA sequence, so the result does not depend on the split.
 * split: acc is already held split (acc_split), so no vf_deint / vf_inter;
 * rescale: 0 when corr is 1 (a later window of the chunk: x1 is exact, so
 * skipping it changes no bit). Both are constants at every call. */
static AI void values_pass(float *acc, size_t H, size_t SB, const kipp_bf16 *vbase, size_t j0, size_t j1,
                           float e[GMAX][CHUNK], const float *corr, size_t d, int split, int rescale)
{
    vf a[8];
#pragma GCC unroll 8
    for (size_t i = 0; i < 8; i++) a[i] = vf_zero(); /* unused lanes, for -Wmaybe-uninitialized */
#pragma GCC unroll 4
    for (size_t h = 0; h < H; h++)
#pragma GCC unroll 2
        for (size_t t = 0; t < SB; t++) {
            const float *p = acc + h * KIPP_HEAD_DIM + d + KB * t;
            vf ev = vf_load(p), od = vf_load(p + VF_LANES);
            if (!split) vf_deint(ev, od, &ev, &od);
            a[(2 * (h * SB + t)) & 7] = rescale ? vf_mul(ev, vf_set1(corr[h])) : ev;
            a[(2 * (h * SB + t) + 1) & 7] = rescale ? vf_mul(od, vf_set1(corr[h])) : od;
        }
    for (size_t j = j0; j < j1; j++) {
        vf ve[2], vo[2];
#pragma GCC unroll 2
        for (size_t t = 0; t < SB; t++) {
            vi v = vi_load(vbase + j * KV_STRIDE + d + KB * t);
            ve[t & 1] = vf_even(v);
            vo[t & 1] = vf_odd(v);
        }
#pragma GCC unroll 4
        for (size_t h = 0; h < H; h++) {
            vf eg = vf_set1(e[h][j]);
#pragma GCC unroll 2
            for (size_t t = 0; t < SB; t++) {
                a[(2 * (h * SB + t)) & 7] = vf_fma(eg, ve[t & 1], a[(2 * (h * SB + t)) & 7]);
                a[(2 * (h * SB + t) + 1) & 7] = vf_fma(eg, vo[t & 1], a[(2 * (h * SB + t) + 1) & 7]);
            }
        }
    }
#pragma GCC unroll 4
    for (size_t h = 0; h < H; h++)
#pragma GCC unroll 2
        for (size_t t = 0; t < SB; t++) {
            float *p = acc + h * KIPP_HEAD_DIM + d + KB * t;
            vf lo = a[(2 * (h * SB + t)) & 7], hi = a[(2 * (h * SB + t) + 1) & 7];
            if (!split) vf_inter(lo, hi, &lo, &hi);
            vf_store(p, lo);
            vf_store(p + VF_LANES, hi);
        }
}

/* values_pass over the whole head for all G heads, at most 4 heads a pass,
 * positions [j0, j1) of the chunk at vbase. */
static AI void chunk_values(float *acc, size_t G, const kipp_bf16 *vbase, size_t j0, size_t j1, float e[GMAX][CHUNK],
                            const float *corr, int split, int rescale)
{
    const size_t SB = G <= 2 ? 2 : 1, HV = G < 4 ? G : 4;
    for (size_t h0 = 0; h0 < G; h0 += HV) {
        size_t H = G - h0 < HV ? G - h0 : HV;
        for (size_t d = 0; d < KIPP_HEAD_DIM; d += KB * SB)
            values_pass(acc + h0 * KIPP_HEAD_DIM, H, SB, vbase, j0, j1, e + h0, corr ? corr + h0 : NULL, d, split,
                        rescale); /* corr is NULL for a chunk's later windows: no arithmetic on it (UBSan) */
    }
}

/* n accumulator vectors [n][128] to or from (join) the split order of
 * values_pass: every KB block as its even elements, then its odd ones. */
static void acc_split(float *acc, size_t n, int join)
{
    for (size_t i = 0; i < n * KIPP_HEAD_DIM; i += KB) {
        vf a = vf_load(acc + i), b = vf_load(acc + i + VF_LANES);
        if (join)
            vf_inter(a, b, &a, &b);
        else
            vf_deint(a, b, &a, &b);
        vf_store(acc + i, a);
        vf_store(acc + i + VF_LANES, b);
    }
}

/* K/V rows sit 2 KB apart (8 KV heads interleaved), which defeats the
 * stream prefetchers, so the kernel prefetches itself: a chunk step of
 * positions [p, p + n) prefetches the same head's rows at [pf, pf + n), one
 * position's K and V rows (8 lines) per position it scores, so the requests
 * trickle out while it computes (docs/PERFORMANCE.md "Kernel design
 * measurements"). The tile walk, with far more compute per chunk, prefetches
 * the next chunk in one burst. */
#define PF_AHEAD 32u

/* One KV head's rows of a layer's paged cache, and the positions [pf, pf_end)
 * a chunk step may prefetch (none when pf >= pf_end). */
typedef struct {
    const kipp_bf16 *kc, *vc; /* layer bases, [position (paged)][8][128] bf16 */
    const uint32_t *bt;       /* block table */
    uint32_t kvh, pf, pf_end;
} kv_view;

/* always_inline: called, a function of prefetches alone is dropped (simd_<level>.h k_prefetch). */
static AI void prefetch_pos(const kv_view *v, uint32_t pos)
{
    size_t off = k_kv_off(v->bt, pos, v->kvh);
    for (size_t b = 0; b < KIPP_HEAD_DIM * 2; b += 64) {
        k_prefetch((const char *)(v->kc + off) + b);
        k_prefetch((const char *)(v->vc + off) + b);
    }
}

/* Online-softmax update of G heads' state with the n <= CHUNK positions at p
 * (inside one page), prefetching v's window as it scores. */
static AI void chunk_step(const float *q, size_t G, const kv_view *v, uint32_t p, uint32_t n, float scale,
                          float *m, float *l, float *acc)
{
    float s[GMAX][CHUNK], corr[GMAX], qs[GMAX][KIPP_HEAD_DIM];
    const size_t off = k_kv_off(v->bt, p, v->kvh), P = G <= 2 ? 4 : G <= 4 ? 2 : 1;
    const kipp_bf16 *kb = v->kc + off;
    q_split(q, G, qs);
    size_t j = 0;
    for (; j + P <= n; j += P) {
#pragma GCC unroll 4
        for (size_t i = 0; i < P; i++)
            if (v->pf + j + i < v->pf_end) prefetch_pos(v, v->pf + (uint32_t)(j + i));
        scores_step(qs, G, P, kb + j * KV_STRIDE, j, scale, s);
    }
    for (; j < n; j++) {
        if (v->pf + j < v->pf_end) prefetch_pos(v, v->pf + (uint32_t)j);
        scores_step(qs, G, 1, kb + j * KV_STRIDE, j, scale, s);
    }
#pragma GCC unroll 8
    for (size_t g = 0; g < G; g++) corr[g] = chunk_softmax(s[g], n, &m[g], &l[g]);
    chunk_values(acc, G, v->vc + off, 0, n, s, corr, 0, 1);
}

/* chunk_step with a constant head count, so the accumulators stay in registers. */
static void step_any(const float *q, size_t G, const kv_view *v, uint32_t p, uint32_t n, float scale, float *m,
                     float *l, float *acc)
{
    switch (G) {
    case 1: chunk_step(q, 1, v, p, n, scale, m, l, acc); break;
    case 2: chunk_step(q, 2, v, p, n, scale, m, l, acc); break;
    case 4: chunk_step(q, 4, v, p, n, scale, m, l, acc); break;
    case 8: chunk_step(q, 8, v, p, n, scale, m, l, acc); break;
    default: chunk_step(q, G, v, p, n, scale, m, l, acc); break;
    }
}

/* ---- many query vectors of one KV head: GEMM-shaped chunks (prefill tiles) ---- */

/* A prefill tile brings T * group query vectors to one KV head, so the
 * chunk's K and V are widened to f32 once (K transposed: kt[d] holds dim d of
 * the chunk's positions) and every query vector's scores come out as a vector
 * over positions, with no horizontal sum per (position, query). Each score is
 * still chunk_step's arithmetic bit for bit: vf_hsum's lane ell accumulates
 * the dims b + 2 ell + {0, 1} (b = 0, KB, ...) in one FMA chain from zero, and
 * its pairwise tree adds lane ell and ell + half for half = VF_LANES/2 ... 1; here
 * each lane's chain runs over a vector of positions and the tree is vertical.
 * The values keep values_pass's per-element order (acc * corr, then one FMA
 * per position in order). So a token's attention does not depend on the size
 * of the tile it is computed in (kernels.h "row invariance"). */
#define TILE_MIN 16u /* query vectors from which the GEMM-shaped walk is used */
#define TILE_Q 16u   /* query vectors per scores/softmax/values block */
#define TS_QB 4u /* query vectors per scores pass: 4 x TS_NC chains (6 x 2 spills on AVX2's 16 ymm) */
#define TV_QB 4u                       /* query vectors per values pass */
#define TV_DV (VF_LANES == 16 ? 4u : 2u)   /* head vectors per values pass: TV_QB x TV_DV accumulators */

/* One chunk's working set for the tile walk, on tile_walk's stack (18 KB,
 * L1-resident while every block of query vectors uses it): K^T and V widened
 * by tile_load, and one TILE_Q block's scores and correction factors. */
typedef struct {
    float kt[KIPP_HEAD_DIM][CHUNK]; /* K^T, f32; positions >= n are 0 */
    float v[CHUNK][KIPP_HEAD_DIM];  /* V rows, f32 */
    float s[TILE_Q][CHUNK];         /* scores, then softmax weights */
    float corr[TILE_Q];             /* exp(m_old - m_new) per query vector of the block */
} tile_chunk;

/* Widen the chunk's n rows at off into t->kt (transposed by VF_LANES x VF_LANES
 * blocks: vf_transpose) and t->v, prefetching the next chunk's rows [pf, pf +
 * CHUNK) that lie before pf_end. */
static void tile_load(const kv_view *v, size_t off, uint32_t n, uint32_t pf, tile_chunk *t)
{
    for (uint32_t j = 0; j < CHUNK && pf + j < v->pf_end; j++) prefetch_pos(v, pf + j);
    for (uint32_t j0 = 0; j0 < CHUNK; j0 += VF_LANES)
        for (size_t d = 0; d < KIPP_HEAD_DIM; d += VF_LANES) {
            vf r[VF_LANES];
#pragma GCC unroll 16
            for (uint32_t j = 0; j < VF_LANES; j++)
                r[j] = j0 + j < n ? vf_widen(v->kc + off + (size_t)(j0 + j) * KV_STRIDE + d) : vf_zero();
            vf_transpose(r);
#pragma GCC unroll 16
            for (uint32_t c = 0; c < VF_LANES; c++) vf_store(t->kt[d + c] + j0, r[c]);
        }
    for (uint32_t j = 0; j < n; j++)
        for (size_t d = 0; d < KIPP_HEAD_DIM; d += VF_LANES)
            vf_store(t->v[j] + d, vf_widen(v->vc + off + (size_t)j * KV_STRIDE + d));
}

#define TS_NC (CHUNK / VF_LANES) /* position vectors per chunk: 2 on AVX2, 1 on AVX-512 */

/* Lane ell of vf_hsum's input for QB query vectors at q (stride 128), over
 * the chunk's TS_NC position vectors of kt: the dims b + 2 ell + {0, 1}, one
 * FMA chain from zero, as scores_step accumulates them. Every broadcast of q
 * feeds TS_NC FMAs, and QB * TS_NC = 8 chains cover the FMA latency on
 * AVX2 (4 chains, one position vector a pass, ran latency-bound there). */
static AI void lane_chain(const float *q, size_t QB, const float (*kt)[CHUNK], size_t ln, vf a[][TS_NC])
{
#pragma GCC unroll 4
    for (size_t i = 0; i < QB; i++)
#pragma GCC unroll 2
        for (size_t c = 0; c < TS_NC; c++) a[i][c] = vf_zero();
#pragma GCC unroll 8
    for (size_t b = 0; b < KIPP_HEAD_DIM; b += KB)
#pragma GCC unroll 2
        for (size_t o = 0; o < 2; o++) {
            size_t d = b + 2 * ln + o;
            vf k[TS_NC];
#pragma GCC unroll 2
            for (size_t c = 0; c < TS_NC; c++) k[c] = vf_load(kt[d] + c * VF_LANES);
#pragma GCC unroll 4
            for (size_t i = 0; i < QB; i++) {
                vf qd = vf_bcast(q + i * KIPP_HEAD_DIM + d);
#pragma GCC unroll 2
                for (size_t c = 0; c < TS_NC; c++) a[i][c] = vf_fma(qd, k[c], a[i][c]);
            }
        }
}

/* Lane index of the k-th leaf in the order that evaluates vf_hsum's tree
 * depth first: the bit reversal of k over log2(VF_LANES) bits. */
static AI size_t leaf_lane(size_t k)
{
    size_t r = 0;
    for (size_t w = 1; w < VF_LANES; w *= 2, k >>= 1) r = r * 2 + (k & 1);
    return r;
}

/* s[i] = scale * q_i . k_j over the chunk's positions for QB query vectors
 * at q (stride 128). The lanes are summed as vf_hsum's tree (lane ell + lane
 * ell + w, w = VF_LANES/2 ... 1) evaluated depth first: leaves in leaf_lane
 * order on a stack of partial sums, the top two added whenever the leaf count
 * is even at that depth, so at most log2(VF_LANES) + 1 partials per query live. */
static AI void tile_scores(const float *q, size_t QB, const float (*kt)[CHUNK], float scale, float (*s)[CHUNK])
{
    vf st[TS_QB][TS_NC][6];
    size_t sp = 0;
    /* AVX2 does not unroll: the partials then live in memory (indexed by sp
     * at run time) and the chains' registers hold K; unrolled, GCC 12 kept
     * the partials in its 16 ymm and re-read K from memory for every FMA.
     * AVX-512 (32 zmm) has the registers for both and stays unrolled. */
#if VF_LANES == 16
#pragma GCC unroll 16
#else
#pragma GCC unroll 1
#endif
    for (size_t k = 0; k < VF_LANES; k++) {
        vf a[TS_QB][TS_NC];
        lane_chain(q, QB, kt, leaf_lane(k), a);
#pragma GCC unroll 4
        for (size_t i = 0; i < QB; i++)
#pragma GCC unroll 2
            for (size_t c = 0; c < TS_NC; c++) st[i][c][sp] = a[i][c];
        sp++;
#pragma GCC unroll 4
        for (size_t n = k + 1; n % 2 == 0; n /= 2, sp--)
#pragma GCC unroll 4
            for (size_t i = 0; i < QB; i++)
#pragma GCC unroll 2
                for (size_t c = 0; c < TS_NC; c++) st[i][c][sp - 2] = vf_add(st[i][c][sp - 2], st[i][c][sp - 1]);
    }
#pragma GCC unroll 4
    for (size_t i = 0; i < QB; i++)
#pragma GCC unroll 2
        for (size_t c = 0; c < TS_NC; c++) vf_store(s[i] + c * VF_LANES, vf_mul(st[i][c][0], vf_set1(scale)));
}

/* acc_i = acc_i * corr_i + sum_{j < n} e_i[j] * v_j for QB query vectors
 * (acc stride 128), TV_DV vectors of the head at a time: per position TV_DV
 * loads of V (pinned) and QB broadcasts feed QB * TV_DV FMAs from registers.
 * (AVX2 took 4 vectors for 2 queries, and GCC read V from memory for every
 * FMA: 10 loads per 8 FMAs against 6 now.) */
static AI void tile_values(float *acc, size_t QB, const float (*v)[KIPP_HEAD_DIM], uint32_t n,
                           const float (*e)[CHUNK], const float *corr)
{
    for (size_t d = 0; d < KIPP_HEAD_DIM; d += TV_DV * VF_LANES) {
        vf a[TV_QB][TV_DV];
#pragma GCC unroll 4
        for (size_t i = 0; i < QB; i++)
#pragma GCC unroll 4
            for (size_t t = 0; t < TV_DV; t++)
                a[i][t] = vf_mul(vf_load(acc + i * KIPP_HEAD_DIM + d + t * VF_LANES), vf_set1(corr[i]));
        for (uint32_t j = 0; j < n; j++) {
            vf vv[TV_DV];
#pragma GCC unroll 4
            for (size_t t = 0; t < TV_DV; t++) {
                vv[t] = vf_load(v[j] + d + t * VF_LANES);
                K_PIN(vv[t]);
            }
#pragma GCC unroll 4
            for (size_t i = 0; i < QB; i++) {
                vf eb = vf_bcast(&e[i][j]);
#pragma GCC unroll 4
                for (size_t t = 0; t < TV_DV; t++) a[i][t] = vf_fma(eb, vv[t], a[i][t]);
            }
        }
#pragma GCC unroll 4
        for (size_t i = 0; i < QB; i++)
#pragma GCC unroll 4
            for (size_t t = 0; t < TV_DV; t++) vf_store(acc + i * KIPP_HEAD_DIM + d + t * VF_LANES, a[i][t]);
    }
}

/* chunk_softmax for the VF_LANES query vectors whose scores are s[0, VF_LANES), at
 * once, bit for bit: the max is exact in any order and so is vf_max(cm, m)
 * (it returns m unless cm > m, as chunk_softmax's select), the exps are per
 * element, the correction is the same vf_exp, and the sum is vf_hsum's tree
 * with the queries' sum vectors transposed, so that a lane's partial sums
 * become rows and the tree adds rows. m, l and corr: VF_LANES consecutive
 * floats, updated. */
static void tile_softmax(float (*s)[CHUNK], uint32_t n, float *m, float *l, float *corr)
{
    vf r[VF_LANES];
    float mx[VF_LANES];
    for (size_t i = 0; i < VF_LANES; i++) {
        for (size_t j = n; j < CHUNK; j++) s[i][j] = -INFINITY;
        vf v = vf_load(s[i]);
        for (size_t j = VF_LANES; j < CHUNK; j += VF_LANES) v = vf_max(v, vf_load(s[i] + j));
        r[i] = v;
    }
    vf_transpose(r);
    vf cm = r[0];
    for (size_t i = 1; i < VF_LANES; i++) cm = vf_max(cm, r[i]);
    vf mo = vf_load(m), mn = vf_max(cm, mo), co = vf_exp(vf_sub(mo, mn));
    vf_store(m, mn);
    vf_store(corr, co);
    vf_store(mx, mn);
    for (size_t i = 0; i < VF_LANES; i++) {
        vf vm = vf_set1(mx[i]), sum = vf_zero();
        for (size_t j = 0; j < CHUNK; j += VF_LANES) {
            vf e = vf_exp(vf_sub(vf_load(s[i] + j), vm));
            vf_store(s[i] + j, e);
            sum = vf_add(sum, e);
        }
        r[i] = sum;
    }
    vf_transpose(r);
    for (size_t w = VF_LANES / 2; w >= 1; w /= 2)
        for (size_t i = 0; i < w; i++) r[i] = vf_add(r[i], r[i + w]);
    vf_store(l, vf_add(vf_mul(vf_load(l), co), r[0]));
}

/* One chunk [p, p + n) for the nq query vectors at q: blocks of TILE_Q. */
static void tile_step(const float *q, size_t nq, tile_chunk *t, uint32_t n, float scale, float *m, float *l,
                      float *acc)
{
    for (size_t i0 = 0; i0 < nq; i0 += TILE_Q) {
        size_t nb = nq - i0 < TILE_Q ? nq - i0 : TILE_Q, i = 0;
        const float *qb = q + i0 * KIPP_HEAD_DIM;
        for (; i + TS_QB <= nb; i += TS_QB)
            tile_scores(qb + i * KIPP_HEAD_DIM, TS_QB, (const float(*)[CHUNK])t->kt, scale, t->s + i);
        for (; i < nb; i++) tile_scores(qb + i * KIPP_HEAD_DIM, 1, (const float(*)[CHUNK])t->kt, scale, t->s + i);
        for (i = 0; i + VF_LANES <= nb; i += VF_LANES) tile_softmax(t->s + i, n, m + i0 + i, l + i0 + i, t->corr + i);
        for (; i < nb; i++) t->corr[i] = chunk_softmax(t->s[i], n, &m[i0 + i], &l[i0 + i]);
        float *ab = acc + i0 * KIPP_HEAD_DIM;
        const float(*vv)[KIPP_HEAD_DIM] = (const float(*)[KIPP_HEAD_DIM])t->v;
        const float(*e)[CHUNK] = (const float(*)[CHUNK])t->s;
        for (i = 0; i + TV_QB <= nb; i += TV_QB)
            tile_values(ab + i * KIPP_HEAD_DIM, TV_QB, vv, n, e + i, t->corr + i);
        for (; i < nb; i++) tile_values(ab + i * KIPP_HEAD_DIM, 1, vv, n, e + i, t->corr + i);
    }
}

/* k_flash_gqa_bf16 for nq >= TILE_MIN query vectors. */
static void tile_walk(const float *q, size_t nq, const kv_view *v, uint32_t p0, uint32_t p1, float scale, float *m,
                      float *l, float *acc)
{
    tile_chunk t;
    for (uint32_t p = p0; p < p0 + k_attn_chunk_len(p0, p1); p++) prefetch_pos(v, p); /* tile_load prefetches the rest */
    for (uint32_t p = p0; p < p1;) {
        uint32_t n = k_attn_chunk_len(p, p1);
        tile_load(v, k_kv_off(v->bt, p, v->kvh), n, p + n, &t);
        tile_step(q, nq, &t, n, scale, m, l, acc);
        p += n;
    }
}

/* Chunk-major: each chunk's K and V rows (16 x 256 B each) are loaded from
 * DRAM once and used by every query vector, so a prefill tile of many
 * queries reads its prefix once. From TILE_MIN vectors on
 * the tile walk takes the chunk (tile_walk); below, passes of GMAX vectors
 * share it in L1 and the first pass prefetches the rows PF_AHEAD positions
 * on. Both give every vector the same bits (tile walk comment). */
void K_SFX(k_flash_gqa_bf16)(const float *q, size_t group, const kipp_bf16 *kc, const kipp_bf16 *vc,
                             uint32_t kvh, const uint32_t *block_table, uint32_t p0, uint32_t p1,
                             float scale, float *m, float *l, float *acc)
{
    kv_view v = {kc, vc, block_table, kvh, 0, p1};
    if (group >= TILE_MIN) {
        tile_walk(q, group, &v, p0, p1, scale, m, l, acc);
        return;
    }
    for (uint32_t p = p0; p < p1 && p < p0 + PF_AHEAD; p++) prefetch_pos(&v, p);
    for (uint32_t p = p0; p < p1;) {
        uint32_t n = k_attn_chunk_len(p, p1);
        for (size_t g0 = 0; g0 < group; g0 += GMAX) {
            size_t G = group - g0 < GMAX ? group - g0 : GMAX;
            v.pf = g0 == 0 ? p + PF_AHEAD : p1;
            step_any(q + g0 * KIPP_HEAD_DIM, G, &v, p, n, scale, m + g0, l + g0, acc + g0 * KIPP_HEAD_DIM);
        }
        p += n;
    }
}

/* ---- KV heads [kvh0, kvh1), position-major (k_flash_rows_bf16) ---- */

#define VW 8u /* positions per values window */

/* One chunk [p, p + n) for query heads [g0, g0 + G) of every KV head in
 * [kvh0, kvh1), consuming the K and V rows in address order: windows of
 * positions outer, KV heads inner. A row holds all 8 heads (2 KB), and a walk
 * that finished one head's rows before the next would read 256 B of each
 * 2 KB row per pass, markedly slower than the same bytes in address order
 * (docs/PERFORMANCE.md "Kernel design measurements"). Each head's
 * arithmetic is chunk_step's: the same
 * scores_step chains and softmax, and values in windows of VW positions, the
 * chunk's correction applied by the first window and x1 (exact) after. */
typedef float rows_qs[KIPP_N_KV_HEAD][GMAX][KIPP_HEAD_DIM]; /* q_split of every KV head's G query heads */

static AI void rows_chunk(const rows_qs qs, size_t group, size_t g0, size_t G, const kipp_bf16 *kc,
                          const kipp_bf16 *vc, const uint32_t *bt, uint32_t kvh0, uint32_t kvh1, uint32_t p,
                          uint32_t n, float scale, float *m, float *l, float *acc)
{
    float s[KIPP_N_KV_HEAD][GMAX][CHUNK], corr[KIPP_N_KV_HEAD][GMAX];
    const size_t off = k_kv_off(bt, p, 0), P = G <= 2 ? 4 : G <= 4 ? 2 : 1;
    size_t j = 0;
    for (; j + P <= n; j += P)
        for (uint32_t h = kvh0; h < kvh1; h++)
            scores_step(qs[h], G, P, kc + off + h * KIPP_HEAD_DIM + j * KV_STRIDE, j, scale, s[h]);
    for (; j < n; j++)
        for (uint32_t h = kvh0; h < kvh1; h++)
            scores_step(qs[h], G, 1, kc + off + h * KIPP_HEAD_DIM + j * KV_STRIDE, j, scale, s[h]);
    for (uint32_t h = kvh0; h < kvh1; h++)
        for (size_t g = 0; g < G; g++) {
            size_t i = h * group + g0 + g;
            corr[h][g] = chunk_softmax(s[h][g], n, &m[i], &l[i]);
        }
    size_t j1 = VW < n ? VW : n;
    for (uint32_t h = kvh0; h < kvh1; h++)
        chunk_values(acc + (h * group + g0) * KIPP_HEAD_DIM, G, vc + off + h * KIPP_HEAD_DIM, 0, j1, s[h], corr[h],
                     1, 1);
    for (size_t j0 = VW; j0 < n; j0 += VW) {
        j1 = j0 + VW < n ? j0 + VW : n;
        for (uint32_t h = kvh0; h < kvh1; h++)
            chunk_values(acc + (h * group + g0) * KIPP_HEAD_DIM, G, vc + off + h * KIPP_HEAD_DIM, j0, j1, s[h], NULL,
                         1, 0);
    }
}

/* rows_chunk with a constant head count, so the accumulators stay in registers. */
static void rows_any(const rows_qs q, size_t group, size_t g0, size_t G, const kipp_bf16 *kc, const kipp_bf16 *vc,
                     const uint32_t *bt, uint32_t kvh0, uint32_t kvh1, uint32_t p, uint32_t n, float scale, float *m,
                     float *l, float *acc)
{
    switch (G) {
    case 1: rows_chunk(q, group, g0, 1, kc, vc, bt, kvh0, kvh1, p, n, scale, m, l, acc); break;
    case 2: rows_chunk(q, group, g0, 2, kc, vc, bt, kvh0, kvh1, p, n, scale, m, l, acc); break;
    case 4: rows_chunk(q, group, g0, 4, kc, vc, bt, kvh0, kvh1, p, n, scale, m, l, acc); break;
    case 8: rows_chunk(q, group, g0, 8, kc, vc, bt, kvh0, kvh1, p, n, scale, m, l, acc); break;
    default: rows_chunk(q, group, g0, G, kc, vc, bt, kvh0, kvh1, p, n, scale, m, l, acc); break;
    }
}

/* Chunk by chunk over [p0, p1), every KV head of the range per chunk. Same
 * chunks and arithmetic per head as k_flash_gqa_bf16 of the same ISA, so the
 * results are bit-identical to calling it per head. No software prefetch
 * (pnext unused): the in-order walk lets the hardware stream prefetchers run
 * ahead. */
void K_SFX(k_flash_rows_bf16)(const float *q, size_t group, const kipp_bf16 *kc, const kipp_bf16 *vc,
                              const uint32_t *block_table, uint32_t kvh0, uint32_t kvh1, uint32_t p0,
                              uint32_t p1, uint32_t pnext, float scale, float *m, float *l, float *acc)
{
    (void)pnext;
    rows_qs qs;
    float *acc_r = acc + (size_t)kvh0 * group * KIPP_HEAD_DIM;
    acc_split(acc_r, (size_t)(kvh1 - kvh0) * group, 0);
    for (size_t g0 = 0; g0 < group; g0 += GMAX) {
        size_t G = group - g0 < GMAX ? group - g0 : GMAX;
        for (uint32_t h = kvh0; h < kvh1; h++) q_split(q + (h * group + g0) * KIPP_HEAD_DIM, G, qs[h]);
        for (uint32_t p = p0; p < p1;) {
            uint32_t n = k_attn_chunk_len(p, p1);
            rows_any((const float(*)[GMAX][KIPP_HEAD_DIM])qs, group, g0, G, kc, vc, block_table, kvh0, kvh1, p, n,
                     scale, m, l, acc);
            p += n;
        }
    }
    acc_split(acc_r, (size_t)(kvh1 - kvh0) * group, 1);
}
