/* common.c - ISA selection, aligned allocation, FP16 (the CPU probes are base/cpuinfo.c). */
#include "kernels/common.h"
#include "kernels/names.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

float kipp_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: renormalise */
            exp = 127 - 15 + 1;
            while (!(man & 0x400u)) { man <<= 1; exp--; }
            u = sign | (exp << 23) | ((man & 0x3ffu) << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t kipp_f32_to_f16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000u;
    int32_t exp = (int32_t)((u >> 23) & 0xffu) - 127 + 15;
    uint32_t man = u & 0x7fffffu;
    if (((u >> 23) & 0xffu) == 0xffu) return (uint16_t)(sign | 0x7c00u | (man ? 0x200u : 0));
    if (exp >= 31) return (uint16_t)(sign | 0x7c00u);
    if (exp <= 0) { /* subnormal or zero */
        if (exp < -10) return (uint16_t)sign;
        man |= 0x800000u;
        uint32_t shift = (uint32_t)(14 - exp);
        uint32_t half = man >> shift, rem = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1u))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t h = sign | ((uint32_t)exp << 10) | (man >> 13), rem = man & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++; /* may carry into exponent: correct */
    return (uint16_t)h;
}

void *kipp_aligned_alloc(size_t bytes)
{
    void *p = NULL;
    if (bytes == 0) bytes = 64;
    if (posix_memalign(&p, 64, (bytes + 63) & ~(size_t)63) != 0) return NULL;
    return p;
}

void kipp_aligned_free(void *p) { free(p); }

int kipp_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double kipp_median(double *v, size_t n)
{
    if (!n) return 0;
    qsort(v, n, sizeof *v, kipp_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static const char *const isa_names[KIPP_ISA_COUNT] = {"ref", "avx2", "avx512", "avx512_bf16"};

const char *kipp_isa_name(kipp_isa isa)
{
    return (unsigned)isa < KIPP_ISA_COUNT ? isa_names[isa] : "?";
}

kipp_isa kipp_isa_cpu_max(void)
{
    if (!KIPP_X86_LEVELS) return KIPP_ISA_REF; /* a portable build: its only level */
    const kipp_cpu_features *f = kipp_cpu_get();
    return f->avx512 && f->avx512_bf16 ? KIPP_ISA_AVX512_BF16
         : f->avx512                   ? KIPP_ISA_AVX512
         : f->avx2                     ? KIPP_ISA_AVX2
                                       : KIPP_ISA_REF;
}

static char isa_unknown_note[160];
static pthread_once_t isa_note_once = PTHREAD_ONCE_INIT;

/* "KIPP_ISA is not one of ref|avx2|...", the levels from isa_names (once: the note is static storage). */
static void write_isa_note(void)
{
    char names[64];
    snprintf(isa_unknown_note, sizeof isa_unknown_note, "KIPP_ISA is not one of %s; using the best available path",
             kipp_join_names(names, sizeof names, isa_names, KIPP_ISA_COUNT, "|"));
}

kipp_isa kipp_isa_select(const char **note)
{
    kipp_isa best = kipp_isa_cpu_max();
    const char *env = getenv("KIPP_ISA");
    if (note) *note = NULL;
    if (!env || !*env) return best;
    int want = -1;
    for (int i = 0; i < KIPP_ISA_COUNT; i++)
        if (!strcmp(env, isa_names[i])) want = i;
    if (want < 0) {
        pthread_once(&isa_note_once, write_isa_note);
        if (note) *note = isa_unknown_note;
        return best;
    }
    if ((kipp_isa)want > best) {
        if (note) *note = KIPP_X86_LEVELS ? "KIPP_ISA asks for an ISA this CPU lacks; using the best available path"
                                          : "KIPP_ISA asks for an x86 level this portable build lacks; using ref";
        return best;
    }
    return (kipp_isa)want;
}
