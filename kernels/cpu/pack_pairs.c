/*
 * pack_pairs.c - k_pack_bf16_pairs (pack_pairs.h): the bf16 packed layout,
 * filled one 32-bit k-pair at a time. In 32-bit units the layout is
 *   wp32[(r/16)*8*cols + (c/2)*16 + r%16] = w32[r*cols/2 + c/2]
 * (kernels.h k_packed_index with the pair kept whole), so a panel is a 16 x
 * cols/2 transpose of 32-bit words; it is walked in blocks of 16 pairs
 * (64 bytes of each of the 16 rows) so both sides stay in L1.
 */
#include <stdint.h>
#include <string.h>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/pack_pairs.h"

void k_pack_bf16_pairs(const void *wv, void *wpv, size_t rows, size_t cols, int ith, int nth)
{
    const size_t kp = cols / 2; /* k-pairs per row */
    size_t r0, r1;
    k_split_rows(rows, ith, nth, 16, &r0, &r1);
    for (size_t p = r0; p < r1; p += 16) {
        const uint32_t *src = (const uint32_t *)((const char *)wv + p * cols * 2);
        uint32_t *dst = (uint32_t *)((char *)wpv + p * cols * 2);
        for (size_t h0 = 0; h0 < kp; h0 += 16) {
            size_t hn = kp - h0 < 16 ? kp - h0 : 16;
            uint32_t blk[16][16]; /* [row][pair] */
            for (int i = 0; i < 16; i++) memcpy(blk[i], src + (size_t)i * kp + h0, hn * 4);
            for (size_t h = 0; h < hn; h++)
                for (int i = 0; i < 16; i++) dst[(h0 + h) * 16 + (size_t)i] = blk[i][h];
        }
    }
}
