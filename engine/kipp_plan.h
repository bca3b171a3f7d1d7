/*
 * kipp_plan.h - public API of the planner (engine/plan_probe.c, engine/plan.c):
 * measure this machine, predict tok/s per weight format, pick a context.
 * Included by kipp.h; part of the engine's public API.
 */
#ifndef KIPP_PLAN_H
#define KIPP_PLAN_H

#include <stddef.h>
#include <stdint.h>

typedef struct kipp_model kipp_model;

/* ---- planner (engine/plan_probe.c, engine/plan.c; seed 002 "Planner") ---- */

/** What kipp_machine_measure found on this machine, now. Plain values: copy freely. */
typedef struct {
    char cpu_id[64];              /* "<vendor>-f<family>m<model>" of /proc/cpuinfo (base/cpuinfo.h kipp_cpu_id) */
    char isa[16];                 /* kernel level the cpu backend uses: "ref", "avx2", "avx512", "avx512_bf16" */
    int physical_cores;           /* hwloc cores (PUs when hwloc finds no core level) */
    int logical_cpus;             /* hwloc PUs */
    uint64_t ram_total_bytes;     /* /proc/meminfo MemTotal, capped by the memory cgroup's limit (v2 or v1) */
    uint64_t ram_available_bytes; /* MemAvailable, capped by the memory cgroup's limit - usage */
    double ram_read_gbps;         /* all-core streaming read, 1e9 B/s (median of the passes of 1.5 s over a buffer >> LLC) */
    double peak_gflops;           /* FP32 FMA peak, all physical cores, at isa's vector width; 0 for "ref" */
    double bf16_dot_gflops;       /* vdpbf16ps peak, all physical cores; 0 below the avx512_bf16 level */
    double int8_dot_gops;         /* vpdpbusd peak, 1e9 multiplies and adds per second (2 per byte product, as
                                     FLOPs count), all physical cores; 0 below the avx512_bf16 level, whose q8_0
                                     and affine4 tiles are the ones that run it */
    char bf16_act[8];             /* how the cpu backend reads bf16 projections (KIPP_BF16_ACT, cpu_backend.c):
                                     "f32", "mixed" (Q|K|V FP32, the rest and attention through the BF16 dot)
                                     or "bf16" */
    char peaks_from[200];         /* "probe", or the machine profile ram_read_gbps and the peaks were read from */
    double disk_read_gbps;        /* sequential read of the model file, 1e9 B/s; 0 when it could not be read */
    uint64_t disk_sample_bytes;   /* bytes of the file read for disk_read_gbps (bounded sample) */
    int disk_direct;              /* 1: O_DIRECT (page cache bypassed); 0: posix_fadvise DONTNEED before reading */
} kipp_machine;

/**
 * Measure this machine for the planner: topology (hwloc), ISA level, RAM
 * (/proc/meminfo and cgroup v2 limits), all-core RAM read bandwidth, the FP32
 * FMA peak, the BF16 and int8 dot peaks where the level runs them and, when
 * model_path is non-NULL, the sequential read speed of that
 * file over a bounded sample (at most 256 MiB or about 1 s). Takes three to
 * four seconds (the RAM probe's median spans 1.5 s, each peak about 0.4 s); allocates and frees a 256 MiB buffer (a quarter of the available RAM
 * when that is less, at least 8 MiB). Errors: KIPP_EIO when
 * /proc/meminfo cannot be read, KIPP_ENOMEM. A model file that cannot be read
 * is not an error: disk_read_gbps stays 0.
 */
int kipp_machine_measure(const char *model_path, kipp_machine *out, char *err, size_t errlen);

/**
 * kipp_machine_measure, but the read bandwidth, the peaks, the ISA level and the CPU id come from a machine
 * profile (kipp.profile.v1, `make profile`: profiles/<host>-<level>-<cpu id>.json) instead of the probes,
 * so a plan can be made for a machine as recorded (and exactly, in tests). Profiles of every age load:
 * one without int8_dot_gops_all (before it was measured) or with null peaks has 0 for them; one without
 * cpu.cpu_id keeps this machine's. The read bandwidth is the larger of read_gbps_all and read_gbps_1t (as
 * kipp-bench takes it). bf16_act follows KIPP_BF16_ACT when set, else "mixed" where the profile's level is
 * avx512_bf16 and its BF16 dot outruns its FP32 FMA, else "f32" (the cpu backend's default rule).
 * profile_path NULL: kipp_machine_measure. Errors: KIPP_EIO (unreadable, not JSON), KIPP_EINVAL (another
 * schema, no read bandwidth or FP32 peak), naming the file and the key.
 */
int kipp_machine_measure_with(const char *model_path, const char *profile_path, kipp_machine *out, char *err,
                              size_t errlen);

/** A benchmark run counts as quiet, and its shares are preferred, when other processes and the hypervisor
 * used less than this share of the CPUs in the second before it (config.cpu_busy_others_at_start; older
 * runs: a 1-minute load average below half the cores). */
#define KIPP_QUIET_BUSY_MAX 0.25

#define KIPP_PLAN_MAX_FORMATS 3
#define KIPP_PLAN_BATCH 8          /* the batched decode the plan predicts: kipp-bench's batch8 row */
#define KIPP_PLAN_SERVE_PROMPT 110 /* the server workload the plan predicts: `make bench-serve`'s prompts ... */
#define KIPP_PLAN_SERVE_TOKENS 64  /* ... and tokens generated per stream */

#define KIPP_PLAN_KV_TYPES KIPP_KV_TYPE_COUNT /* bf16 and q8_0 (kipp_plan_format.kv_fit), in kipp_kv_type order */

/** The longest context one weight format leaves room for with one KV cache type: the KV of every cached
 * token in all the available RAM beside the format's weights (no quarter kept back, unlike kipp_plan.ctx;
 * activation scratch not counted: an upper bound). */
typedef struct {
    char kv_type[8];               /* "bf16" (2 bytes a value) or "q8_0" (llama.cpp's block: 32 int8 values and
                                      an FP16 scale, 34 bytes per 32 values) */
    double kv_bytes_per_token;     /* all layers, K and V, in this type, bytes */
    uint64_t free_bytes;           /* ram_available_bytes minus the format's weight_bytes; 0 when they do not fit */
    uint32_t max_ctx;              /* whole 32-token blocks of KV in free_bytes, at most context_length; tokens */
    uint32_t ram_ctx;              /* the same without the context_length cap: how far the RAM alone goes */
} kipp_plan_kv_fit;

/** The planner's prediction for one weight format of the model's shape. */
typedef struct {
    char format[16];               /* kipp.quant.scheme: "bf16", "q8_0", "affine4_gs32" */
    double weight_bytes;           /* every tensor in this format, bytes (norms, embedding and head stay BF16) */
    double decode_bytes_per_token; /* weights + KV read by one decode step at a short context, bytes */
    double prefill_flops_per_token;/* FLOPs per token of a 512-token prefill */
    double prefill_peak_gflops;    /* this format's own peak for that prefill: its FLOPs over the sum of each part's
                                      FLOPs at the peak of the instruction the cpu backend runs it with */
    char arith[160];               /* which part runs which instruction, e.g. "q|k|v fp32, o/gate|up/down bf16, ..." */
    double decode_eff;             /* share of ram_read_gbps Kipp's decode reaches */
    double prefill_eff;            /* share of prefill_peak_gflops Kipp's prefill reaches */
    char decode_source[320];       /* the runs the decode share is the median of ("FILE share" each, FILE in
                                      kipp_plan.results_dir), or "assumed" */
    char prefill_source[320];      /* the same for the prefill share */
    double decode_tps, prefill_tps;/* predicted tokens per second */
    double prefill_limit_tps;      /* prefill at the whole format peak (prefill_tps / prefill_eff) */
    /* batched decode: KIPP_PLAN_BATCH sequences, one token each per step, every row sampling */
    double batch_bytes_per_step;   /* weights once + each sequence's KV at kipp-bench's batch context, bytes */
    double batch_flops_per_step;   /* B x (projections + attention + head), FLOPs */
    double batch_limit_tps;        /* B / max(bytes / ram_read_gbps, FLOPs at the format's peaks): the step limit */
    double batch_eff;              /* share of that limit Kipp's batch8 row reaches (1 / (1 + overhead / limit)) */
    double batch_overhead_ms;      /* the step time beyond the limit the share implies, ms */
    char batch_source[320];        /* the runs the batch share is the median of, or "assumed" */
    double batch_tps;              /* predicted aggregate tok/s at B = KIPP_PLAN_BATCH */
    /* the server: --max-batch streams of KIPP_PLAN_SERVE_PROMPT prompt tokens and KIPP_PLAN_SERVE_TOKENS each */
    uint32_t serve_max_batch;      /* the --max-batch the plan picks: the smallest of 8, 16, 32, 64 whose decode
                                      rate is within 10% of 64's (past it a step is compute-bound: more streams
                                      only lengthen each token's wait) */
    double serve_tps;              /* that many streams' aggregate: all their tokens over the prefill of every
                                      prompt plus (tokens - 1) decode steps of that batch */
    kipp_plan_kv_fit kv_fit[KIPP_PLAN_KV_TYPES]; /* the longest context per KV type: bf16, q8_0 */
    char rationale[2560];          /* the arithmetic above, as one paragraph */
} kipp_plan_format;

/** A plan: the machine, the model's needs and the predictions (kipp_plan_make). */
typedef struct {
    kipp_machine machine;
    char model_id[64];             /* registry id */
    char file_format[16];          /* the opened file's scheme */
    uint64_t kv_bytes_per_token;   /* all layers, K and V, in the model's KV type */
    char kv_type[8];               /* the model's KV type (--kv-type): "bf16" or "q8_0" */
    uint64_t kv_type_bytes[KIPP_KV_TYPE_COUNT]; /* KV bytes per token of each KV type (kipp_kv_type_bytes) */
    uint64_t usable_ram_bytes;     /* ram_available_bytes minus the resident weights (0 when they do not fit) */
    uint32_t ctx;                  /* tokens: KV of ctx fits usable_ram_bytes / 4; multiple of 32, <= context_length */
    uint32_t context_length;       /* the model's longest context: the file's max_position_embeddings, or with YaRN
                                      (the file's or --rope-scaling) original_context x factor */
    char context_limit[256];       /* why context_length (kipp_context_limit_note): "the YaRN limit 32768 x 4 of
                                      qwen3-8b", or the file's length and what the card's YaRN would allow */
    double rope_factor;            /* YaRN factor in use, 0 = none */
    uint32_t rope_original_context;/* YaRN original context in use, tokens; 0 = none */
    uint32_t card_yarn_context;    /* the context the registry's model card gives with YaRN, 0 = none */
    uint32_t n_layer, layers_resident, layers_streamed; /* resident + streamed == n_layer */
    int streamed;                  /* 1: file weights > 0.75 x available RAM: layers are read from disk per token */
    int head_resident;             /* 1: the output head stays in RAM (always, unless streamed and the head alone
                                      exceeds the budget: then it too is read from the file per token) */
    char results_dir[256];         /* where the shares were looked for (kipp_plan_make's results_dir); "" for none */
    char results_skipped[320];     /* model benchmarks of this cpu_id in results_dir that could not be read, with
                                      why ("FILE (line 3: ...)"; "; " between; "N more, M in all" when full), or
                                      results_dir itself when it cannot be opened; "" when none. ASCII. */
    size_t n_formats;
    kipp_plan_format formats[KIPP_PLAN_MAX_FORMATS];
} kipp_plan;

/**
 * Plan for an open model (any backend, "none" included) on the measured
 * machine: resident vs streamed layers (streamed when the file's weights exceed
 * 0.75 x available RAM), the context whose KV fits a quarter of the usable RAM,
 * and per format the predicted decode tok/s (bytes per token over the read
 * bandwidth, times Kipp's measured share), prefill tok/s (FLOPs per token
 * over the format's own peak, times the share), batched decode at B = 8
 * (the step limit times the share) and the server's aggregate. Shares come
 * from the newest model benchmarks (results/DATE-HOST-CPUID-cpu-SHA.json)
 * of this cpu_id and ISA level in results_dir (NULL: none, assumed shares); such a file that does not
 * parse is named in results_skipped, not an error.
 * Errors: KIPP_EINVAL for NULL arguments.
 */
int kipp_plan_make(const kipp_model *model, const kipp_machine *mc, const char *results_dir, kipp_plan *out,
                   char *err, size_t errlen);

/**
 * kipp_plan_make for a model shape given as its facts (kipp_model_get_info's, or kipp_plan_shape's for a
 * registry entry without a file). Errors: KIPP_EINVAL for NULL arguments.
 */
int kipp_plan_make_info(const kipp_model_info *in, const kipp_machine *mc, const char *results_dir, kipp_plan *out,
                        char *err, size_t errlen);

/**
 * The facts a BF16 file of the registry's checkpoint_id would have (dimensions, tied head, context length
 * without RoPE scaling, BF16 KV bytes per token, the bytes of every tensor in BF16), for planning a shape
 * no file of which is at hand (`kipp plan --shape ID`). Strings are static. Errors: KIPP_EINVAL naming the
 * id when the registry has no such entry.
 */
int kipp_plan_shape(const char *checkpoint_id, kipp_model_info *out, char *err, size_t errlen);

/**
 * The context kipp_plan_make would pick for this model, from RAM figures only
 * (no bandwidth probes): what `--ctx 0` uses. Errors: KIPP_EIO when
 * /proc/meminfo cannot be read, KIPP_ERANGE when not even 32 positions fit.
 */
int kipp_plan_context(const kipp_model *model, uint32_t *ctx, char *err, size_t errlen);


/** The plan as JSON text (schema "kipp.plan.v1"); malloc'd, the caller frees; NULL when out of memory. */
char *kipp_plan_json(const kipp_plan *p);

/** The plan as human-readable lines, rationale included; malloc'd, the caller frees; NULL when out of memory. */
char *kipp_plan_text(const kipp_plan *p);

#endif
