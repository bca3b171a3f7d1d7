/* common.c - CPU feature detection, ISA selection, aligned allocation, FP16. */
#include "kernels/common.h"
#include "kernels/names.h"

#include <cpuid.h>
#include <ctype.h>
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

static int os_saves_zmm(void)
{
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (lo & 0xe6u) == 0xe6u; /* XMM, YMM, opmask, ZMM_Hi256, Hi16_ZMM */
}

static int os_saves_ymm(void)
{
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (lo & 0x6u) == 0x6u;
}

const kipp_cpu_features *kipp_cpu_get(void)
{
    static kipp_cpu_features f;
    static int done;
    if (done) return &f;
    unsigned a, b, c, d;
    if (__get_cpuid(0, &a, &b, &c, &d)) { /* vendor string in ebx, edx, ecx */
        char vendor[13];
        memcpy(vendor, &b, 4), memcpy(vendor + 4, &d, 4), memcpy(vendor + 8, &c, 4), vendor[12] = '\0';
        f.bf16_dot_fast = !strcmp(vendor, "AuthenticAMD");
    }
    if (__get_cpuid(1, &a, &b, &c, &d)) {
        int osxsave = (c >> 27) & 1, fma = (c >> 12) & 1, f16c = (c >> 29) & 1;
        unsigned a7, b7, c7, d7, a71, b71, c71, d71;
        if (osxsave && __get_cpuid_count(7, 0, &a7, &b7, &c7, &d7)) {
            int ymm = os_saves_ymm(), zmm = ymm && os_saves_zmm();
            f.avx2 = ymm && fma && f16c && ((b7 >> 5) & 1);
            f.avx512 = zmm && f.avx2 && ((b7 >> 16) & 1) && ((b7 >> 17) & 1) &&
                       ((b7 >> 30) & 1) && ((b7 >> 31) & 1);
            f.avx512_vnni = f.avx512 && ((c7 >> 11) & 1);
            if (__get_cpuid_count(7, 1, &a71, &b71, &c71, &d71))
                f.avx512_bf16 = f.avx512 && ((a71 >> 5) & 1);
        }
    }
    done = 1;
    return &f;
}

static const char *const isa_names[KIPP_ISA_COUNT] = {"ref", "avx2", "avx512", "avx512_bf16"};

const char *kipp_isa_name(kipp_isa isa)
{
    return (unsigned)isa < KIPP_ISA_COUNT ? isa_names[isa] : "?";
}

kipp_isa kipp_isa_cpu_max(void)
{
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
        if (note) *note = "KIPP_ISA asks for an ISA this CPU lacks; using the best available path";
        return best;
    }
    return (kipp_isa)want;
}

/* ---- CPU identity (/proc/cpuinfo) ---- */

static char cpu_model_buf[256];
static char cpu_id_buf[64];
static pthread_once_t cpu_model_once = PTHREAD_ONCE_INIT;

/* The value after "key<spaces>:" of a /proc/cpuinfo line, or NULL when the
 * line is another key ("model" must not match "model name"). */
static const char *cpuinfo_value(const char *line, const char *key)
{
    size_t n = strlen(key);
    if (strncmp(line, key, n)) return NULL;
    const char *v = line + n;
    while (*v == ' ' || *v == '\t') v++;
    if (*v != ':') return NULL;
    for (v++; *v == ' ' || *v == '\t'; v++) {}
    return v;
}

/* The first processor's "model name", and "vendor_id", "cpu family" and
 * "model" as "<vendor>-f<family>m<model>" (x86 Linux; the model name alone
 * reads "AMD EPYC" on both the Zen 4 and the Zen 5 machines here). */
static void read_cpu_model(void)
{
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512], vendor[32] = "", family[16] = "", model[16] = "";
    const char *v;
    while (f && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        if (!line[0]) break; /* end of the first processor's block */
        if ((v = cpuinfo_value(line, "model name"))) snprintf(cpu_model_buf, sizeof cpu_model_buf, "%s", v);
        else if ((v = cpuinfo_value(line, "vendor_id"))) snprintf(vendor, sizeof vendor, "%s", v);
        else if ((v = cpuinfo_value(line, "cpu family"))) snprintf(family, sizeof family, "%s", v);
        else if ((v = cpuinfo_value(line, "model"))) snprintf(model, sizeof model, "%s", v);
    }
    if (f) fclose(f);
    const char *ven = !strcmp(vendor, "AuthenticAMD") ? "amd" : !strcmp(vendor, "GenuineIntel") ? "intel" : "cpu";
    if (family[0] && model[0]) snprintf(cpu_id_buf, sizeof cpu_id_buf, "%s-f%sm%s", ven, family, model);
    for (char *c = cpu_id_buf; *c; c++) /* keep file names plain */
        if (!isalnum((unsigned char)*c) && *c != '-') *c = '_';
}

const char *kipp_cpu_id(void)
{
    pthread_once(&cpu_model_once, read_cpu_model);
    return cpu_id_buf[0] ? cpu_id_buf : "cpu-unknown";
}

const char *kipp_cpu_model(void)
{
    pthread_once(&cpu_model_once, read_cpu_model);
    return cpu_model_buf[0] ? cpu_model_buf : "unknown";
}
