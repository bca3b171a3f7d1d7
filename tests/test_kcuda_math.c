/*
 * test_kcuda_math.c - the CUDA kernels' index arithmetic and element decode
 * (kernels/cuda/kcuda_math.h, __host__ __device__ helpers the .cu units call)
 * checked on the host against the CPU references, so that the part of the
 * CUDA kernels that a GPU-less machine can check is checked on every
 * `make test`: bf16 / f16 bit conversions (kernels/common.h), the Q8_0 and
 * Q4_1 element decode and the kernels' word-wise code extraction (against the
 * FP32 file-layout oracles of kernels/cpu/ref_q8_0.c and ref_affine4.c), the
 * paged KV slot (k_kv_off) over non-identity block tables and page edges,
 * the attention split, the tile bounds and the mma.sync fragment maps.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/kernels.h"
#include "kernels/cuda/kcuda_math.h"
#include "tests/test_harness.h"

static uint32_t f2u(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static float u2f(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint64_t rs = 0x9e3779b97f4a7c15ULL;
static uint32_t rnd(void)
{
    rs ^= rs << 13; rs ^= rs >> 7; rs ^= rs << 17;
    return (uint32_t)(rs >> 16);
}

static void test_f16_all(void)
{
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++)
        if (f2u(kc_f16_to_f32((uint16_t)h)) != f2u(kipp_f16_to_f32((uint16_t)h)) && bad++ < 5)
            CHECK(0, "f16 %04x: %08x vs %08x", h, f2u(kc_f16_to_f32((uint16_t)h)), f2u(kipp_f16_to_f32((uint16_t)h)));
    CHECK(!bad, "%d f16 values differ", bad);
}

static void test_bf16(void)
{
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++)
        bad += f2u(kc_bf16_to_f32((uint16_t)h)) != f2u(kipp_bf16_to_f32((uint16_t)h));
    CHECK(!bad, "%d bf16 widenings differ", bad);
    const uint32_t special[] = {0, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u, 0xffffffffu,
                                0x00000001u, 0x007fffffu, 0x3f808000u, 0x3f818000u, 0x3f807fffu, 0x7f7fffffu};
    for (size_t i = 0; i < sizeof special / sizeof special[0]; i++)
        CHECK(kc_f32_to_bf16(u2f(special[i])) == kipp_f32_to_bf16(u2f(special[i])), "bits %08x", special[i]);
    bad = 0;
    for (uint64_t u = 0; u < 0x100000000ull; u += 65521) /* every exponent, many mantissas and ties */
        bad += kc_f32_to_bf16(u2f((uint32_t)u)) != kipp_f32_to_bf16(u2f((uint32_t)u));
    CHECK(!bad, "%d bf16 roundings differ", bad);
}

/* hi + lo carries x to ~2^-17 relative; hi is x's bf16 */
static void test_split_bf16(void)
{
    for (int i = 0; i < 100000; i++) {
        float x = ((float)rnd() / 4294967296.0f * 2.0f - 1.0f) * ldexpf(1.0f, (int)(rnd() % 40) - 20);
        uint16_t hi, lo;
        kc_split_bf16(x, &hi, &lo);
        float r = x - kipp_bf16_to_f32(hi) - kipp_bf16_to_f32(lo);
        CHECK(hi == kipp_f32_to_bf16(x), "hi of %g", x);
        if (fabsf(r) > ldexpf(fabsf(x), -16)) { CHECK(0, "x %g residual %g", x, r); break; }
    }
}

/* Every element of a [rows][cols] quantized matrix against the oracle with x = identity. */
static void check_decode(k_fmt f, size_t rows, size_t cols)
{
    const k_fmt_info *fi = k_fmt_get(f);
    const uint32_t bb = fi->file->block_bytes;
    float *wf = malloc(rows * cols * 4), *eye = calloc(cols * cols, 4), *y = malloc(cols * rows * 4);
    uint8_t *w = malloc(k_fmt_file_bytes(fi, rows, cols));
    CHECK(wf && eye && y && w, "alloc");
    if (!wf || !eye || !y || !w) goto out;
    for (size_t i = 0; i < rows * cols; i++) wf[i] = ((float)rnd() / 4294967296.0f - 0.5f) * 0.1f;
    for (size_t c = 0; c < cols; c++) eye[c * cols + c] = 1.0f;
    wf[3] = 0.0f; /* a block with a zero and, below, one constant block (d = 0 for Q8_0's amax 0 only) */
    for (size_t c = 32; c < 64 && cols >= 64; c++) wf[c] = 0.0f;
    fi->from_f32(wf, w, rows, cols);
    fi->linear_ref(w, eye, y, rows, cols, cols, 0, 1); /* y[c][r] = W[r][c] */
    int bad = 0, badw = 0;
    for (size_t r = 0; r < rows; r++)
        for (size_t c = 0; c < cols; c++) {
            const uint8_t *blk = w + kc_qblock_off(r, c / KC_QBLOCK, cols, bb);
            uint32_t i = (uint32_t)(c % KC_QBLOCK);
            float v = f == K_FMT_Q8_0 ? kc_q8_0_weight(blk, i) : kc_q4_1_weight(blk, i);
            if (v != y[c * rows + r] && bad++ < 5) CHECK(0, "%s w[%zu][%zu] %g vs oracle %g", fi->name, r, c, v, y[c * rows + r]);
            /* the kernels' word-wise code reads agree with the element decode */
            if (f == K_FMT_Q8_0) {
                uint16_t pair = (uint16_t)(blk[2 + (i & ~1u)] | blk[3 + (i & ~1u)] << 8);
                badw += kc_q8_0_pair_code(pair, i & 1u) != kc_q8_0_q(blk, i);
            } else {
                uint32_t h = i / 16u, k = (i % 16u) / 4u, b = i % 4u, word;
                memcpy(&word, blk + 4 + 4 * k, 4); /* little-endian host, as the GPU */
                badw += kc_q4_1_word_code(word, h, b) != kc_q4_1_q(blk, i);
            }
        }
    CHECK(!bad, "%s: %d elements differ from the oracle", fi->name, bad);
    CHECK(!badw, "%s: %d word-wise codes differ", fi->name, badw);
out:
    free(wf); free(eye); free(y); free(w);
}

static void test_q8_0_decode(void) { check_decode(K_FMT_Q8_0, 5, 96); check_decode(K_FMT_Q8_0, 3, 1056); }
static void test_q4_1_decode(void) { check_decode(K_FMT_AFFINE4, 5, 96); check_decode(K_FMT_AFFINE4, 3, 1056); }

/* Several sequences' tables concatenated, scrambled: every (row, pos, head) offset equals k_kv_off. */
static void test_kv_slot(void)
{
    enum { NSEQ = 3, NLOG = 130 };
    uint32_t bt[NSEQ * NLOG], perm[NSEQ * NLOG + 7];
    for (uint32_t i = 0; i < NSEQ * NLOG + 7; i++) perm[i] = i;
    for (uint32_t i = NSEQ * NLOG + 7; i > 1; i--) { uint32_t j = rnd() % i, t = perm[i - 1]; perm[i - 1] = perm[j]; perm[j] = t; }
    memcpy(bt, perm, sizeof bt);
    int bad = 0, identity = 1;
    for (uint32_t i = 0; i < NSEQ * NLOG; i++) identity &= bt[i] == i;
    CHECK(!identity, "the table must not be the identity");
    for (uint32_t s = 0; s < NSEQ; s++) {
        int32_t off = (int32_t)(s * NLOG);
        for (uint32_t pos = 0; pos < NLOG * 32; pos++) {
            size_t slot = kc_kv_slot(bt, off, pos);
            bad += slot / 32 != bt[off + pos / 32] || slot % 32 != pos % 32;
            for (uint32_t h = 0; h < KIPP_N_KV_HEAD; h++)
                bad += kc_kv_elem(slot, KIPP_N_KV_HEAD, h) != k_kv_off(bt + off, pos, h);
        }
    }
    CHECK(!bad, "%d slot offsets differ from k_kv_off", bad);
    /* page edges by hand: pos 31 | 32 change page, 77 is page 2 slot 13 */
    CHECK(kc_kv_slot(bt, 0, 31) == (size_t)bt[0] * 32 + 31 && kc_kv_slot(bt, 0, 32) == (size_t)bt[1] * 32, "edge");
    CHECK(kc_kv_slot(bt, NLOG, 77) == (size_t)bt[NLOG + 2] * 32 + 13, "pos 77 of the second sequence");
}

static void test_tiles(void)
{
    const uint32_t ns[] = {0, 1, 7, 8, 9, 33, 63, 64, 65, 512, 1000, 151936};
    const uint32_t tiles[] = {1, 4, 32, 64};
    for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++)
        for (size_t b = 0; b < sizeof tiles / sizeof tiles[0]; b++) {
            uint32_t n = ns[a], t = tiles[b], nt = kc_n_tiles(n, t), prev = 0, lo, hi;
            for (uint32_t i = 0; i < nt; i++) {
                kc_tile(n, t, i, &lo, &hi);
                CHECK(lo == prev && hi > lo && hi - lo <= t, "n %u tile %u #%u: [%u, %u)", n, t, i, lo, hi);
                prev = hi;
            }
            CHECK(prev == n, "n %u tile %u covers %u", n, t, prev);
            kc_tile(n, t, nt, &lo, &hi);
            CHECK(lo == n && hi == n, "past the end");
        }
}

/* The splits partition the row's pages in order, each non-empty one has work, no split sees a page past len. */
static void test_attn_split(void)
{
    int bad = 0;
    for (uint32_t len = 1; len <= 5000; len += (len < 200 ? 1 : 37))
        for (uint32_t ns = 1; ns <= KC_ATTN_MAX_SPLIT; ns++) {
            uint32_t chunks = (len + 31) / 32, prev = 0, nonempty = 0;
            for (uint32_t s = 0; s < ns; s++) {
                uint32_t c0, c1;
                kc_attn_split(len, ns, s, &c0, &c1);
                bad += c0 != prev || c1 < c0 || c1 > chunks;
                if (c1 > c0) {
                    nonempty++;
                    bad += (c1 - c0 < KC_ATTN_MIN_CHUNKS && c1 != chunks); /* only the last may be short */
                    bad += (c1 - 1) * 32 >= len;                          /* its last page holds a position */
                }
                prev = c1;
            }
            bad += prev != chunks || nonempty == 0 || nonempty > ns;
        }
    CHECK(!bad, "%d split violations", bad);
    const uint32_t nq[] = {16, 32, 40, 64, 128, 1024};
    for (uint32_t r = 1; r <= 1024; r++)
        for (size_t i = 0; i < sizeof nq / sizeof nq[0]; i++) {
            uint32_t n = kc_attn_n_split(r, 8, nq[i]);
            CHECK(n >= 1 && n <= KC_ATTN_MAX_SPLIT, "rows %u heads %u: %u splits", r, nq[i], n);
            CHECK(n == 1 || (uint64_t)r * nq[i] * n <= KC_ATTN_SCRATCH_STATES, "scratch overflow rows %u heads %u", r, nq[i]);
            if (r * 8 >= 256) CHECK(n == 1, "rows %u alone fill the GPU", r);
        }
    CHECK(kc_attn_n_split(1, 8, 16) == 32 && kc_attn_n_split(8, 8, 16) == 4, "decode splits");
}

/* Each fragment map is a bijection onto its tile, and a register's two halves are adjacent in k. */
static void test_mma_maps(void)
{
    int seen_a[16][16] = {{0}}, seen_b[16][8] = {{0}}, seen_c[16][8] = {{0}}, bad = 0;
    for (uint32_t lane = 0; lane < 32; lane++) {
        for (uint32_t e = 0; e < 8; e++) {
            uint32_t r, c, r2, c2;
            kc_mma_a_rc(lane, e, &r, &c);
            if (r < 16 && c < 16) seen_a[r][c]++; else bad++;
            if (e % 2 == 0) { kc_mma_a_rc(lane, e + 1, &r2, &c2); bad += r2 != r || c2 != c + 1 || c % 2; }
        }
        for (uint32_t e = 0; e < 4; e++) {
            uint32_t k, n, k2, n2, r, c;
            kc_mma_b_kn(lane, e, &k, &n);
            if (k < 16 && n < 8) seen_b[k][n]++; else bad++;
            if (e % 2 == 0) { kc_mma_b_kn(lane, e + 1, &k2, &n2); bad += n2 != n || k2 != k + 1 || k % 2; }
            kc_mma_c_rc(lane, e, &r, &c);
            if (r < 16 && c < 8) seen_c[r][c]++; else bad++;
        }
    }
    for (int i = 0; i < 16; i++) {
        for (int j = 0; j < 16; j++) bad += seen_a[i][j] != 1;
        for (int j = 0; j < 8; j++) bad += seen_b[i][j] != 1 || seen_c[i][j] != 1;
    }
    CHECK(!bad, "%d fragment map violations", bad);
    /* A bijection can still be the transpose: each map against the PTX ISA's own formulas ("Matrix
     * Fragments for mma.m16n8k16 with floating point type", .f16/.bf16 A and B, .f32 C), written as
     * the ISA writes them: groupID = laneid >> 2, threadID_in_group = laneid % 4. */
    int bad_isa = 0;
    for (uint32_t lane = 0; lane < 32; lane++) {
        const uint32_t gid = lane >> 2, tig = lane % 4;
        for (uint32_t i = 0; i < 8; i++) {
            uint32_t r, c;
            kc_mma_a_rc(lane, i, &r, &c);
            bad_isa += r != ((i < 2 || (4 <= i && i < 6)) ? gid : gid + 8);
            bad_isa += c != (i < 4 ? tig * 2 + (i & 1) : tig * 2 + (i & 1) + 8);
        }
        for (uint32_t i = 0; i < 4; i++) {
            uint32_t k, n, r, c;
            kc_mma_b_kn(lane, i, &k, &n);
            bad_isa += k != (i < 2 ? tig * 2 + (i & 1) : tig * 2 + (i & 1) + 8) || n != gid;
            kc_mma_c_rc(lane, i, &r, &c);
            bad_isa += r != (i < 2 ? gid : gid + 8) || c != tig * 2 + (i & 1);
        }
    }
    CHECK(!bad_isa, "%d fragment coordinates differ from the PTX ISA formulas", bad_isa);
}

int main(void)
{
    RUN(test_f16_all);
    RUN(test_bf16);
    RUN(test_split_bf16);
    RUN(test_q8_0_decode);
    RUN(test_q4_1_decode);
    RUN(test_kv_slot);
    RUN(test_tiles);
    RUN(test_attn_split);
    RUN(test_mma_maps);
    return th_finish();
}
