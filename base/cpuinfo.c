/* cpuinfo.c - CPUID feature flags and /proc/cpuinfo identity (base/cpuinfo.h). */
#include "base/cpuinfo.h"

#include <ctype.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

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
#else
const kipp_cpu_features *kipp_cpu_get(void)
{
    static const kipp_cpu_features none; /* no x86 vector levels: the ref kernels */
    return &none;
}
#endif

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
