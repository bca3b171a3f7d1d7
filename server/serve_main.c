/*
 * serve_main.c - `kipp-serve --model M`: arguments, model, scheduler, HTTP,
 * and a graceful drain on SIGINT/SIGTERM: new requests get 503 while the
 * running ones finish (up to --shutdown-timeout), then the rest are ended
 * with a proper final chunk or response before the process exits 0.
 * Loopback by default.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "server/kv_events.h"
#include "server/serve_http.h"

#ifndef KIPP_VERSION
#define KIPP_VERSION "unknown"
#define KIPP_GIT_SHA "unknown"
#endif

#define SERVE_MAX_LORA 8 /* --lora entries */

typedef struct {
    const char *model, *backend, *host, *alias, *api_key, *cors_origin;
    const char *kv_events; /* --kv-events endpoint, NULL = off */
    const char *kv_events_format; /* --kv-events-format: "array" (default) or "map" */
    const char *kv_events_replay; /* --kv-events-replay endpoint, NULL = none */
    int protect_ops, access_log;
    long long shutdown_timeout; /* seconds running requests may take to finish after SIGTERM */
    long long port, threads, ctx, max_batch, max_queue, max_body, max_header, idle, max_conn, kv_mib, step_tokens;
    long long kv_pool_mib; /* -1: not given (one full context of KV); 0: unpooled */
    const char *kv_cache_dir;    /* --kv-cache-dir: the KV disk tier's directory, NULL = off */
    long long kv_cache_disk_mib; /* --kv-cache-disk-mib: its budget; -1 = not given */
    double step_ms;           /* --step-ms: ms, 0 = off, < 0 = auto */
    int no_spec;              /* --no-spec */
    int embeddings;           /* --embeddings: /v1/embeddings on a generation model too (llama-server's flag) */
    const char *draft_model;  /* --draft-model FILE: draft-model speculation, NULL = prompt lookup */
    const char *draft_self;   /* --draft-self q8_0|affine4: the converter's twin of --model as the draft */
    char draft_path[4096];    /* the --draft-self file */
    long long draft_max, draft_min; /* --draft-max/--draft-min: draft lengths, 1..16; 0 = not given */
    kipp_model *draft;        /* the opened draft model */
    int stream, no_prefetch;  /* --stream auto|on|off (KIPP_STREAM_*), --no-prefetch */
    int rope_override;        /* --rope-scaling given: rope replaces the file's scaling */
    kipp_rope_scaling rope;
    int kv_type;              /* --kv-type bf16|q8_0 (KIPP_KV_*) */
    kipp_lora_spec lora[SERVE_MAX_LORA]; /* --lora PATH[:SCALE], repeatable; paths in lora_path */
    char lora_path[SERVE_MAX_LORA][4096];
    uint32_t n_lora;
} serve_opts;

typedef struct {
    const char *flag;
    long long *dst;
    long long lo, hi;
    const char *help;
} int_opt;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kipp-serve --model FILE.gguf [options]\n"
            "  --model FILE       the model (required)\n"
            "  --backend NAME     cpu (default), ref, or cuda (the build/cuda binaries of `make cuda`)\n"
            "  --host ADDR        listen address, default 127.0.0.1 (loopback)\n"
            "  --port N           0..65535, default 8080 (0 = any free port, printed at start)\n"
            "  --alias NAME       the served model name: responses' \"model\", first in /v1/models; the\n"
            "                     checkpoint id (and the file's base name) stay accepted\n"
            "  --threads N        backend threads, 0 = one per physical core (default)\n"
            "  --lora PATH[:SCALE]  merge a LoRA adapter GGUF into the weights at load, scaled (default 1);\n"
            "                     repeatable, at most 8 (their deltas add up)\n"
            "  --ctx N            tokens per choice (prompt + output), default min(8192, model context);\n"
            "                     0: measure this machine, print the plan (`kipp plan`) and use its context\n"
            "  --rope-scaling none|yarn:F[:ORIG]  RoPE scaling instead of the file's: YaRN, factor F over ORIG\n"
            "                     original context tokens (default: the model card's, else the file's context\n"
            "                     length), so --ctx may reach ORIG x F; none turns it off\n"
            "  --kv-type bf16|q8_0  the KV cache's type: q8_0 keeps int8 values and an fp16 scale per 32 (34/64\n"
            "                     of bf16's bytes per token: about twice the context per GiB); default bf16\n"
            "  --max-batch N      active choices per step, 8..64, default 16\n"
            "  --max-queue N      requests waiting for a batch slot before 429, 1..4096, default 64 (requests\n"
            "                     that free slots will take at the next step do not count)\n"
            "  --step-tokens N    tokens one engine step evaluates, 16..8192, default 2048: every decoding\n"
            "                     choice's tokens first, then prompt chunks oldest first (each prefilling\n"
            "                     choice gets up to 32 while the budget lasts, the rest lengthens them)\n"
            "  --step-ms 0|auto|MS  time target of a step that prefills while more choices decode than\n"
            "                     prefill (stall-free batching): prompt chunks get only the tokens the measured\n"
            "                     step cost says fit beside the decodes (the oldest prompt still gets 16 a step);\n"
            "                     a burst (at least as many prompts as decoding choices) takes the token budget.\n"
            "                     auto (default) = twice the cost of a step where every active choice decodes,\n"
            "                     MS in 1..60000 fixes it, 0 = off. Lower ITL p99 for higher TTFT\n"
            "  --max-body N       request body bytes, default 1048576 (larger: 413)\n"
            "  --max-header N     per-connection header memory in bytes, default 32768 (larger: 431)\n"
            "  --idle-timeout S   close idle connections after S seconds, default 60\n"
            "  --max-connections N  default 128\n"
            "  --kv-pool-mib N    shared KV pool in MiB (on cuda: device memory), default half the available\n"
            "                     memory at start, at most --max-batch full contexts, at least one; every\n"
            "                     choice adopts the longest cached prompt prefix, finished choices publish\n"
            "                     theirs; KV is taken as sequences grow, and when the pool runs out the\n"
            "                     youngest choice is preempted and later recomputed. 0 disables the pool\n"
            "  --kv-mib N         without the pool: KV budget of all live choices in MiB, default 4096;\n"
            "                     requests wait for room, and one that alone needs more is refused (400);\n"
            "                     needs --kv-pool-mib 0 (refused with the pool)\n"
            "  --shutdown-timeout S  on SIGTERM/SIGINT: new requests get 503 and /health 503 while running\n"
            "                     ones finish for up to S seconds (0..86400, default 30); the rest then end\n"
            "                     with finish_reason \"length\" and the text so far; a second signal ends them\n"
            "                     at once; exit status 0\n"
            "  --api-key KEY      require \"Authorization: Bearer KEY\" or \"X-Api-Key: KEY\" (else 401);\n"
            "                     /health and /metrics stay open unless --protect-ops (env KIPP_API_KEY too)\n"
            "  --protect-ops      /health and /metrics need the API key as well\n"
            "  --cors-origin ORIGIN  answer CORS preflights (OPTIONS, 204) and send\n"
            "                     Access-Control-Allow-Origin: ORIGIN (\"*\" for any) on every response\n"
            "  --kv-events tcp://HOST:PORT  publish KV pool events (block stored / removed / all cleared) in\n"
            "                     vLLM's KV-events format (msgpack over ZeroMQ PUB) for prefix-aware routers;\n"
            "                     host * binds here (tcp://*:5557), any other host is connected to; off by default\n"
            "  --kv-events-replay tcp://HOST:PORT  also bind a ROUTER socket that resends the last batches to\n"
            "                     a subscriber that missed some (vLLM's replay protocol)\n"
            "  --kv-events-format array|map  msgspec structs as arrays (vLLM's array_like releases, llm-d;\n"
            "                     the default) or as tagged maps (newer vLLM, vllm-router's kv_aware policy)\n"
            "  --access-log       one JSON line per request on stderr (id, method, path, status, tokens,\n"
            "                     cached tokens, TTFT, duration)\n"
            "  --version          print the version and exit\n"
            "  --stream auto|on|off  read the weights through the file mapping per token, no packed copy\n"
            "                     (models larger than RAM); default auto: when they exceed 0.75 x available RAM\n"
            "  --no-prefetch      streamed: no one-layer-ahead madvise(MADV_WILLNEED) prefetch thread\n"
            "  --kv-cache-dir DIR a disk tier under the KV pool: published blocks are written to DIR (created\n"
            "                     0700) in the background and read back, verified, by later prompts and by later\n"
            "                     processes of the same model (in the background too: running streams keep\n"
            "                     stepping); default off\n"
            "  --kv-cache-disk-mib N  the tier's size in MiB, least recently used chain tails removed first;\n"
            "                     default 4096\n"
            "  --no-spec          greedy requests (temperature 0 or top_k 1) decode one token per step;\n"
            "                     by default they use prompt-lookup speculative decoding (same tokens)\n"
            "  --draft-model FILE a draft model with the model's tokenizer (e.g. its q8_0/affine4 twin) drafts\n"
            "                     instead: greedy choices keep their exact tokens, sampled ones their\n"
            "                     distribution (speculative sampling); each choice has its own draft session\n"
            "  --draft-self q8_0|affine4  as --draft-model with the converter's quantized twin next to --model\n"
            "                     (X.gguf: X-q8_0-head_q8_0.gguf, else X-q8_0.gguf; likewise affine4_gs32)\n"
            "  --draft-max N      with a draft model: longest draft, 1..16 tokens; default 8\n"
            "  --draft-min N      with a draft model: a draft the gate allows is at least N tokens, 1..--draft-max\n"
            "  --embeddings       serve POST /v1/embeddings with a generation model too (last-token pooling of\n"
            "                     its final hidden state); an embedding model serves it without this flag\n");
}

/* The draft options' combinations (parse_args); resolves --draft-self's file into draft_path. 0 or 2 (printed). */
static int check_draft(serve_opts *o)
{
    const char *draft = o->draft_model ? "--draft-model" : o->draft_self ? "--draft-self" : NULL;
    if (o->draft_model && o->draft_self)
        return fprintf(stderr, "kipp-serve: --draft-model and --draft-self both name a draft, expected one of them\n"), 2;
    if (draft && o->no_spec)
        return fprintf(stderr, "kipp-serve: %s and --no-spec: speculation is off, expected one of them\n", draft), 2;
    if (!draft && (o->draft_max || o->draft_min))
        return fprintf(stderr, "kipp-serve: %s applies to a draft model, expected it with --draft-model or --draft-self\n",
                       o->draft_max ? "--draft-max" : "--draft-min"), 2;
    long long longest = o->draft_max ? o->draft_max : 8;
    if (o->draft_min > longest)
        return fprintf(stderr, "kipp-serve: --draft-min %lld is above the longest draft %lld, expected at most "
                               "--draft-max\n", o->draft_min, longest), 2;
    char err[1024];
    if (o->draft_self && kipp_draft_self_path(o->model, o->draft_self, o->draft_path, sizeof o->draft_path, err, sizeof err))
        return fprintf(stderr, "kipp-serve: %s\n", err), 2;
    if (o->draft_self) o->draft_model = o->draft_path;
    return 0;
}

static int parse_args(int argc, char **argv, serve_opts *o)
{
    *o = (serve_opts){.backend = "cpu", .host = "127.0.0.1", .port = 8080, .max_batch = 16, .max_queue = 64,
                      .max_body = 1 << 20, .max_header = 32768, .idle = 60, .max_conn = 128, .kv_mib = -1,
                      .step_tokens = SERVE_STEP_TOKENS, .step_ms = SERVE_STEP_MS_DEFAULT, .kv_pool_mib = -1, .shutdown_timeout = 30, .ctx = -1,
                      .kv_cache_disk_mib = -1,
                      .api_key = getenv("KIPP_API_KEY")};
    const int_opt ints[] = {
        {"--port", &o->port, 0, 65535, ""},           {"--threads", &o->threads, 0, 1024, ""},
        {"--ctx", &o->ctx, 0, 1 << 30, ""},          {"--max-batch", &o->max_batch, SERVE_MAX_N, SERVE_MAX_BATCH, ""},
        {"--max-queue", &o->max_queue, 1, 4096, ""}, {"--max-body", &o->max_body, 64, 1LL << 30, ""},
        {"--max-header", &o->max_header, 4096, 1 << 24, ""}, {"--idle-timeout", &o->idle, 1, 86400, ""},
        {"--max-connections", &o->max_conn, 1, 4096, ""}, {"--kv-mib", &o->kv_mib, 1, 1 << 24, ""},
        {"--kv-pool-mib", &o->kv_pool_mib, 0, 1 << 24, ""}, {"--step-tokens", &o->step_tokens, 16, 8192, ""},
        {"--shutdown-timeout", &o->shutdown_timeout, 0, 86400, ""},
        {"--kv-cache-disk-mib", &o->kv_cache_disk_mib, 1, 1LL << 30, ""},
        {"--draft-max", &o->draft_max, 1, KIPP_SPEC_K_MAX, ""}, {"--draft-min", &o->draft_min, 1, KIPP_SPEC_K_MAX, ""},
    };
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help")) return usage(stdout), 1;
        if (!strcmp(a, "--version")) return printf("kipp-serve %s (%s)\n", KIPP_VERSION, KIPP_GIT_SHA), 1;
        if (!strcmp(a, "--no-spec")) { o->no_spec = 1; continue; }
        if (!strcmp(a, "--embeddings")) { o->embeddings = 1; continue; }
        if (!strcmp(a, "--protect-ops")) { o->protect_ops = 1; continue; }
        if (!strcmp(a, "--access-log")) { o->access_log = 1; continue; }
        if (!strcmp(a, "--no-prefetch")) { o->no_prefetch = 1; continue; }
        if (i + 1 >= argc) return fprintf(stderr, "kipp-serve: %s needs a value (or is unknown; see --help)\n", a), 2;
        const char *v = argv[++i];
        if (!strcmp(a, "--model")) { o->model = v; continue; }
        if (!strcmp(a, "--draft-model")) { o->draft_model = v; continue; }
        if (!strcmp(a, "--draft-self")) {
            if (strcmp(v, "q8_0") && strcmp(v, "affine4"))
                return fprintf(stderr, "kipp-serve: --draft-self '%s' is invalid, expected q8_0 or affine4\n", v), 2;
            o->draft_self = v;
            continue;
        }
        if (!strcmp(a, "--backend")) { o->backend = v; continue; }
        if (!strcmp(a, "--host")) { o->host = v; continue; }
        if (!strcmp(a, "--alias")) { o->alias = v; continue; }
        if (!strcmp(a, "--api-key")) { o->api_key = v; continue; }
        if (!strcmp(a, "--cors-origin")) { o->cors_origin = v; continue; }
        if (!strcmp(a, "--lora")) {
            char err[256];
            if (o->n_lora >= SERVE_MAX_LORA) return fprintf(stderr, "kipp-serve: --lora '%s': at most 8 adapters\n", v), 2;
            if (kipp_lora_parse_arg(v, &o->lora[o->n_lora], o->lora_path[o->n_lora], sizeof o->lora_path[0], err, sizeof err))
                return fprintf(stderr, "kipp-serve: %s\n", err), 2;
            o->n_lora++;
            continue;
        }
        if (!strcmp(a, "--kv-type")) {
            char err[256];
            if (kipp_kv_type_parse(v, &o->kv_type, err, sizeof err)) return fprintf(stderr, "kipp-serve: %s\n", err), 2;
            continue;
        }
        if (!strcmp(a, "--rope-scaling")) {
            char err[384];
            if (kipp_rope_scaling_parse(v, &o->rope, err, sizeof err)) return fprintf(stderr, "kipp-serve: %s\n", err), 2;
            o->rope_override = 1;
            continue;
        }
        if (!strcmp(a, "--stream")) {
            o->stream = !strcmp(v, "auto") ? KIPP_STREAM_AUTO : !strcmp(v, "on") ? KIPP_STREAM_ON : !strcmp(v, "off") ? KIPP_STREAM_OFF : -1;
            if (o->stream < 0) return fprintf(stderr, "kipp-serve: --stream '%s' is invalid, expected auto, on or off\n", v), 2;
            continue;
        }
        if (!strcmp(a, "--step-ms")) {
            char *end;
            errno = 0;
            int is_auto = !strcmp(v, "auto");
            long long x = is_auto ? -1 : strtoll(v, &end, 10);
            if (!is_auto && (errno || !*v || *end || x < 0 || x > SERVE_STEP_MS_MAX))
                return fprintf(stderr, "kipp-serve: --step-ms '%s' is invalid, expected auto, 0 (off: the token budget "
                                       "alone) or a target in 1..%d ms\n", v, SERVE_STEP_MS_MAX), 2;
            o->step_ms = (double)x;
            continue;
        }
        if (!strcmp(a, "--kv-cache-dir")) { o->kv_cache_dir = v; continue; }
        if (!strcmp(a, "--kv-events")) { o->kv_events = v; continue; }
        if (!strcmp(a, "--kv-events-format")) { o->kv_events_format = v; continue; }
        if (!strcmp(a, "--kv-events-replay")) { o->kv_events_replay = v; continue; }
        size_t k = 0;
        while (k < sizeof ints / sizeof ints[0] && strcmp(a, ints[k].flag)) k++;
        if (k == sizeof ints / sizeof ints[0]) return fprintf(stderr, "kipp-serve: unknown option '%s' (see --help)\n", a), 2;
        char *end;
        errno = 0;
        long long x = strtoll(v, &end, 10);
        if (errno || !*v || *end || x < ints[k].lo || x > ints[k].hi)
            return fprintf(stderr, "kipp-serve: %s '%s' is invalid, expected an integer in %lld..%lld\n", a, v, ints[k].lo,
                           ints[k].hi), 2;
        *ints[k].dst = x;
    }
    if (!o->model) return fprintf(stderr, "kipp-serve: --model FILE.gguf is required (see --help)\n"), 2;
    if (check_draft(o)) return 2;
    /* --kv-mib budgets the unpooled server only; with the pool it used to be ignored silently. */
    if (o->kv_mib >= 0 && o->kv_pool_mib != 0)
        return fprintf(stderr, "kipp-serve: --kv-mib %lld applies only without the KV pool, which is on (%s); size the "
                               "pool with --kv-pool-mib, or add --kv-pool-mib 0 to budget unpooled sessions with --kv-mib\n",
                       o->kv_mib, o->kv_pool_mib < 0 ? "by default" : "--kv-pool-mib given"), 2;
    if (o->kv_mib < 0) o->kv_mib = 4096;
    if (o->kv_cache_disk_mib >= 0 && !o->kv_cache_dir)
        return fprintf(stderr, "kipp-serve: --kv-cache-disk-mib sizes the disk tier, which is off; add --kv-cache-dir DIR\n"), 2;
    if (o->kv_cache_dir && (!*o->kv_cache_dir || o->kv_pool_mib == 0))
        return fprintf(stderr, "kipp-serve: --kv-cache-dir '%s': %s\n", o->kv_cache_dir,
                       *o->kv_cache_dir ? "the disk tier sits under the KV pool, and --kv-pool-mib 0 turns the pool off"
                                        : "empty, expected a directory"), 2;
    if (o->kv_cache_disk_mib < 0) o->kv_cache_disk_mib = 4096;
    if (o->api_key && !*o->api_key) return fprintf(stderr, "kipp-serve: --api-key is empty, expected a non-empty key\n"), 2;
    if (o->protect_ops && !o->api_key) return fprintf(stderr, "kipp-serve: --protect-ops needs --api-key KEY\n"), 2;
    if (o->alias && !*o->alias) return fprintf(stderr, "kipp-serve: --alias is empty, expected a model name\n"), 2;
    if (o->cors_origin && (!*o->cors_origin || strpbrk(o->cors_origin, "\r\n ,")))
        return fprintf(stderr, "kipp-serve: --cors-origin '%s' is invalid, expected one origin such as "
                               "https://app.example.com, or *\n", o->cors_origin), 2;
    char err[320];
    if (o->kv_events && serve_kv_events_check(o->kv_events, err, sizeof err)) return fprintf(stderr, "kipp-serve: %s\n", err), 2;
    if (o->kv_events_format && strcmp(o->kv_events_format, "array") && strcmp(o->kv_events_format, "map"))
        return fprintf(stderr, "kipp-serve: --kv-events-format '%s' is invalid, expected array or map\n", o->kv_events_format), 2;
    if ((o->kv_events_format || o->kv_events_replay) && !o->kv_events)
        return fprintf(stderr, "kipp-serve: %s needs --kv-events tcp://HOST:PORT\n",
                       o->kv_events_format ? "--kv-events-format" : "--kv-events-replay"), 2;
    if (o->kv_events_replay && serve_kv_events_check_flag("--kv-events-replay", o->kv_events_replay, err, sizeof err))
        return fprintf(stderr, "kipp-serve: %s\n", err), 2;
    if (o->kv_events && o->kv_pool_mib == 0)
        return fprintf(stderr, "kipp-serve: --kv-events publishes the KV pool's blocks, and --kv-pool-mib 0 turns the pool "
                               "off; drop one of them\n"), 2;
    return 0;
}

static int make_addr(const serve_opts *o, struct sockaddr_storage *ss)
{
    memset(ss, 0, sizeof *ss);
    struct sockaddr_in *a4 = (struct sockaddr_in *)ss;
    struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)ss;
    if (inet_pton(AF_INET, o->host, &a4->sin_addr) == 1) {
        a4->sin_family = AF_INET, a4->sin_port = htons((uint16_t)o->port);
        return 0;
    }
    if (inet_pton(AF_INET6, o->host, &a6->sin6_addr) == 1) {
        a6->sin6_family = AF_INET6, a6->sin6_port = htons((uint16_t)o->port);
        return 0;
    }
    fprintf(stderr, "kipp-serve: --host '%s' is not a numeric IPv4 or IPv6 address (e.g. 127.0.0.1)\n", o->host);
    return 2;
}

/* The file's base name without .gguf, as a second accepted model name. */
static char *base_name(const char *path)
{
    const char *b = strrchr(path, '/');
    char *s = strdup(b ? b + 1 : path);
    size_t n = s ? strlen(s) : 0;
    if (n > 5 && !strcmp(s + n - 5, ".gguf")) s[n - 5] = 0;
    return s;
}

/* Wait up to secs for the signals in set; 1 when one arrived. */
static int signal_within(const sigset_t *set, double secs)
{
    struct timespec ts = {(time_t)secs, (long)((secs - (double)(time_t)secs) * 1e9)};
    return sigtimedwait(set, NULL, &ts) > 0;
}

/* Drain (after the first SIGTERM/SIGINT): new requests already get 503; wait
 * while requests run, up to the timeout or a second signal, then end the rest
 * (serve_sched_end_all) and give their threads a moment to write the final
 * chunk, [DONE] or the response before the daemon closes the connections. */
static void drain(serve_http *h, const sigset_t *set, int sig, double timeout)
{
    __atomic_store_n(&h->draining, 1, __ATOMIC_RELEASE);
    serve_log("signal %d: draining; new requests get 503; %d running or queued, waiting up to %.0f s (a second "
              "signal ends them now)", sig, serve_sched_busy(h->sched), timeout);
    double t0 = serve_now(), end = t0 + timeout;
    int again = 0;
    while (!again && serve_now() < end &&
           (serve_sched_busy(h->sched) || __atomic_load_n(&h->inflight, __ATOMIC_ACQUIRE)))
        again = signal_within(set, 0.05);
    int left = serve_sched_busy(h->sched);
    if (left) serve_log("%s: ending %d running or queued requests with finish_reason \"length\"",
                        again ? "second signal" : "shutdown timeout", left);
    serve_sched_end_all(h->sched);
    /* Replies of ended jobs are complete in memory; their threads only write them out. */
    for (double flush_end = serve_now() + 10; __atomic_load_n(&h->inflight, __ATOMIC_ACQUIRE) && serve_now() < flush_end;)
        if (signal_within(set, 0.02)) break;
    serve_log("drained in %.2f s, exiting", serve_now() - t0);
}

/* MemAvailable from /proc/meminfo in bytes, 0 when unreadable. */
static uint64_t mem_available(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    unsigned long long kib = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1) break;
    if (f) fclose(f);
    return (uint64_t)kib << 10;
}

/* The default KV pool (no --kv-pool-mib): half the available memory, at most
 * max_batch contexts of n_ctx (more could never be referenced at once; the
 * rest would only cache), at least one context so any single request fits. */
static int default_pool(const serve_opts *o, kipp_model *m, uint32_t n_ctx, char *why, size_t cap)
{
    kipp_model_info info;
    kipp_model_get_info(m, &info);
    uint64_t per_ctx = ((uint64_t)n_ctx + 31) / 32 * 32 * info.kv_bytes_per_token, avail = mem_available(); /* whole blocks */
    uint64_t bytes = avail / 2, most = per_ctx * (uint64_t)o->max_batch;
    const char *rule = "half of the available memory";
    if (bytes > most) bytes = most, rule = "--max-batch full contexts";
    if (bytes < per_ctx) bytes = per_ctx, rule = "one full context";
    snprintf(why, cap, "%s; %.1f GiB available", rule, (double)avail / (1 << 30));
    char err[256];
    if (kipp_model_enable_pool(m, (bytes + (1 << 20) - 1) >> 20, err, sizeof err))
        return serve_log("cannot make the default KV pool (%s): %s", why, err), 1;
    return 0;
}

/* --ctx 0: measure this machine, print the plan (`kipp plan`'s text) and take its context. Shares come from
 * results/ beside the build directory (build/kipp-serve -> results/). 0, or 1 after printing why not. */
static int plan_ctx(const serve_opts *o, kipp_model *m, uint32_t *n_ctx)
{
    char exe[4096] = "", dir[4200] = "", err[512] = "";
    ssize_t l = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (l > 0) {
        exe[l] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) *slash = 0, snprintf(dir, sizeof dir, "%s/../results", exe);
    }
    kipp_machine mc;
    kipp_plan p;
    int rc = kipp_machine_measure(o->model, &mc, err, sizeof err);
    if (!rc) rc = kipp_plan_make(m, &mc, dir[0] ? dir : NULL, &p, err, sizeof err);
    if (!rc && p.ctx == 0) rc = KIPP_ERANGE, snprintf(err, sizeof err, "not even 32 positions of KV fit a quarter of the usable RAM");
    if (rc) return fprintf(stderr, "kipp-serve: --ctx 0: %s\n", err), 1;
    char *text = kipp_plan_text(&p);
    if (text) fprintf(stderr, "kipp-serve: plan (--ctx 0)\n%s", text);
    free(text);
    *n_ctx = p.ctx;
    return 0;
}

static int run(const serve_opts *o, kipp_model *m)
{
    kipp_model_info info;
    kipp_model_get_info(m, &info);
    uint32_t n_ctx = o->ctx > 0 ? (uint32_t)o->ctx : (info.context_length < 8192 ? info.context_length : 8192);
    if (o->ctx == 0 && plan_ctx(o, m, &n_ctx)) return 1;
    char why[256];
    if (n_ctx > info.context_length)
        return fprintf(stderr, "kipp-serve: --ctx %u is above %u tokens, %s; expected 1..%u\n", n_ctx,
                       info.context_length, kipp_context_limit_note(&info, why, sizeof why), info.context_length), 2;
    char pool_why[128] = "--kv-pool-mib";
    if (o->kv_pool_mib < 0 && default_pool(o, m, n_ctx, pool_why, sizeof pool_why)) return 1;
    if (o->kv_cache_dir) { /* before the listener and the scheduler: the tier reports DISK events, adopts at match */
        char derr[512];
        if (kipp_model_enable_disk_tier(m, o->kv_cache_dir, (uint64_t)o->kv_cache_disk_mib, derr, sizeof derr))
            return serve_log("%s", derr), 1;
        kipp_model_disk_set_async(m, 1); /* reads off the scheduler thread (sched_load.c) */
        serve_metrics_set_disk(m);
    }
    kipp_model_get_info(m, &info);
    struct sockaddr_storage ss;
    if (make_addr(o, &ss)) return 2;
    char err[256] = "";
    uint64_t block_bytes = 32 * info.kv_bytes_per_token;
    serve_sched_opts so = {.max_choices = (int)o->max_batch, .max_queue = (int)o->max_queue, .n_ctx = n_ctx,
                           .kv_budget_blocks = ((uint64_t)o->kv_mib << 20) / block_bytes,
                           .pool_blocks = info.kv_pool_blocks, .no_spec = o->no_spec, .draft = o->draft,
                           .draft_max = (uint32_t)o->draft_max, .draft_min = (uint32_t)o->draft_min,
                           .step_tokens = (uint32_t)o->step_tokens, .step_ms = o->step_ms};
    serve_http h = {.max_body = (size_t)o->max_body, .max_header = (size_t)o->max_header, .started = time(NULL),
                    .api_key = o->api_key, .protect_ops = o->protect_ops, .cors_origin = o->cors_origin,
                    .access_log = o->access_log, .canonical = info.checkpoint_id, .task = kipp_model_task(m),
                    .embeddings = o->embeddings};
    serve_metrics_set_model(o->alias ? o->alias : info.checkpoint_id); /* before any thread reads it */
    serve_metrics_set_kv(info.kv_type, info.kv_bytes_per_token);
    serve_kv_events *kev = NULL;
    if (o->kv_events) { /* before the scheduler: every block the pool ever stores is reported */
        serve_kv_events_opts ko = {
            .endpoint = o->kv_events,
            .replay = o->kv_events_replay,
            .format = o->kv_events_format && !strcmp(o->kv_events_format, "map") ? SERVE_KV_EVENTS_MAP : SERVE_KV_EVENTS_ARRAY,
        };
        if (!(kev = serve_kv_events_start(&ko, err, sizeof err))) return serve_log("%s", err), 1;
        kipp_model_set_kv_listener(m, serve_kv_events_on_event, kev);
    }
    h.sched = serve_sched_start(m, &so, err, sizeof err);
    if (!h.sched) {
        kipp_model_set_kv_listener(m, NULL, NULL);
        serve_kv_events_stop(kev);
        return serve_log("%s", err), 1;
    }
    char *base = base_name(o->model);
    h.info = (serve_info){o->alias ? o->alias : info.checkpoint_id, m, n_ctx};
    h.names[h.n_names++] = info.checkpoint_id;
    if (base) h.names[h.n_names++] = base;
    if (o->alias) h.names[h.n_names++] = o->alias;
    sigset_t set;
    sigemptyset(&set), sigaddset(&set, SIGINT), sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL); /* every thread started below inherits the mask */
    signal(SIGPIPE, SIG_IGN);
    int rc = 0;
    if (serve_http_start(&h, (struct sockaddr *)&ss, (unsigned)o->max_conn, (unsigned)o->idle)) {
        serve_log("cannot listen on %s port %lld (in use, or not an address of this host)", o->host, o->port);
        rc = 1;
    } else {
        char kv[4608];
        if (info.kv_pool_blocks)
            snprintf(kv, sizeof kv, "KV %s, %llu bytes/token; KV pool %u blocks, %.2f GiB: %s", info.kv_type,
                     (unsigned long long)info.kv_bytes_per_token, info.kv_pool_blocks,
                     (double)info.kv_pool_blocks * (double)block_bytes / (1 << 30), pool_why);
        else snprintf(kv, sizeof kv, "KV %s, %llu bytes/token; no KV pool, KV budget %llu blocks (--kv-mib)", info.kv_type,
                      (unsigned long long)info.kv_bytes_per_token, (unsigned long long)so.kv_budget_blocks);
        if (o->kv_cache_dir)
            snprintf(kv + strlen(kv), sizeof kv - strlen(kv), "; disk tier %s, %lld MiB", o->kv_cache_dir, o->kv_cache_disk_mib);
        if (o->draft) snprintf(kv + strlen(kv), sizeof kv - strlen(kv), "; draft model %s", o->draft_model);
        if (info.kv_pool_blocks && (uint64_t)info.kv_pool_blocks * 32 < n_ctx)
            serve_log("note: the KV pool holds %llu positions, fewer than one context (n_ctx %u); a reply "
                      "without max_tokens ends there (finish_reason \"length\"), and a larger max_tokens is refused: "
                      "raise --kv-pool-mib", (unsigned long long)info.kv_pool_blocks * 32, n_ctx);
        serve_log_out("%s (%s backend, n_ctx %u, batch %lld, %s%s) listening on http://%s%s%s:%u", h.info.model_id,
                      info.backend, n_ctx, o->max_batch, kv, o->api_key ? ", API key required" : "",
                      strchr(o->host, ':') ? "[" : "", o->host, strchr(o->host, ':') ? "]" : "", h.port);
        int sig = 0;
        sigwait(&set, &sig);
        drain(&h, &set, sig, (double)o->shutdown_timeout);
    }
    serve_http_stop(&h);
    serve_sched_stop(h.sched);
    if (kev) {
        /* The replica's cache goes away with it: say so, so a router forgets its blocks. */
        if (kipp_model_pool_clear(m, err, sizeof err)) serve_log("kv-events: %s", err);
        kipp_model_set_kv_listener(m, NULL, NULL);
        serve_kv_events_stop(kev);
    }
    free(base);
    return rc;
}

/* The library's notes (a slower kernel level, streamed weights) as kipp-serve's timestamped lines. */
static void engine_note(void *user, const char *line)
{
    (void)user;
    serve_log("%s", line);
}

int main(int argc, char **argv)
{
    serve_opts o;
    int rc = parse_args(argc, argv, &o);
    if (rc) return rc == 1 ? 0 : rc;
    kipp_log_set_sink(engine_note, NULL);
    kipp_model_options mo = {.n_threads = (int)o.threads, .lora = o.lora, .n_lora = o.n_lora, .stream = o.stream,
                             .no_prefetch = o.no_prefetch, .rope_override = o.rope_override, .rope = o.rope,
                             .kv_type = o.kv_type};
    kipp_model *m = NULL;
    char err[512];
    /* Pooled by default (seed 000: the server uses pooled models on CPU): --kv-pool-mib N sizes the pool
     * here, without it run() sizes it from memory and the context; --kv-pool-mib 0 opts out. */
    int orc = o.kv_pool_mib > 0 ? kipp_model_open_pooled(o.model, o.backend, &mo, (uint64_t)o.kv_pool_mib, &m,
                                                         err, sizeof err)
                                : kipp_model_open(o.model, o.backend, &mo, &m, err, sizeof err);
    if (orc) { /* name the file when the loader's message does not (a header it rejects) */
        if (orc != KIPP_EBACKEND && !strstr(err, o.model)) serve_log("'%s': %s", o.model, err);
        else serve_log("%s", err);
        return 1;
    }
    kipp_model_info info;
    kipp_model_get_info(m, &info);
    if (info.n_lora)
        serve_log("merged %u LoRA adapter(s) into %u tensors (%.1f MiB private RAM) in %.0f ms", info.n_lora,
                  info.lora_tensors, info.lora_bytes / 1048576.0, info.lora_merge_ms);
    if (o.draft_model) { /* unpooled: each choice's draft session is its own; --no-spec refused in check_draft */
        /* the draft sees the target's positions: the same RoPE scaling override */
        kipp_model_options dmo = {.n_threads = (int)o.threads, .stream = o.stream, .no_prefetch = o.no_prefetch,
                                  .rope_override = o.rope_override, .rope = o.rope};
        int drc = kipp_model_open(o.draft_model, o.backend, &dmo, &o.draft, err, sizeof err);
        if (!drc) drc = kipp_draft_check(m, o.draft, err, sizeof err);
        if (drc) {
            serve_log("--draft-model '%s' cannot draft for --model '%s': %s", o.draft_model, o.model, err);
            kipp_model_close(o.draft);
            kipp_model_close(m);
            return 2;
        }
    }
    rc = run(&o, m);
    kipp_model_close(o.draft);
    kipp_model_close(m);
    return rc;
}
