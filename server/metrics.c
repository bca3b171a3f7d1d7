/*
 * metrics.c - GET /metrics in the Prometheus text format 0.0.4: request
 * counts, token counts, TTFT and inter-token latency histograms, queue depth,
 * active choices, KV blocks held, the KV pool's occupancy and reuse counters,
 * each scheduler step's time by phase and the stall-free planner's state
 * (step_metrics), and vLLM's router gauges, request counters and latency
 * histograms beside them (vllm_metrics, vllm_requests). All numbers are
 * guarded by the scheduler's mutex and written only through the
 * serve_metrics_on_* events (serve.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/serve.h"

static serve_metrics g_metrics;
static const double BOUNDS[SERVE_HIST_BUCKETS] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                                  0.25,  0.5,    1,     2.5,  5,     10,  30};
static const char *STATUS[6] = {"2xx", "400", "404", "413", "429", "5xx"};

serve_metrics *serve_metrics_get(void) { return &g_metrics; }

static void serve_hist_add(serve_hist *h, double seconds)
{
    int b = 0;
    while (b < SERVE_HIST_BUCKETS && seconds > BOUNDS[b]) b++;
    h->count[b]++;
    h->sum += seconds;
    h->n++;
}

/* vLLM's bucket upper bounds, per SERVE_VH_* (vllm/v1/metrics/loggers.py): TTFT; the inter-token
 * latency (the bounds of its older name, time_per_output_token_seconds); and
 * the request latency bounds shared by e2e, queue, prefill, decode and inference. */
static const double VB_TTFT[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
                                 1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
static const double VB_ITL[] = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
                                0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
static const double VB_REQ[] = {0.3,  0.5,  0.8,  1.0,  1.5,  2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
                                30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
#define NB(a) (int)(sizeof a / sizeof a[0])
static const struct {
    const char *name, *help;
    const double *b;
    int n;
} VHIST[SERVE_VH_COUNT] = {
    [SERVE_VH_TTFT] = {"vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", VB_TTFT, NB(VB_TTFT)},
    [SERVE_VH_ITL] = {"vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", VB_ITL, NB(VB_ITL)},
    [SERVE_VH_E2E] = {"vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", VB_REQ, NB(VB_REQ)},
    [SERVE_VH_QUEUE] = {"vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", VB_REQ,
                        NB(VB_REQ)},
    [SERVE_VH_PREFILL] = {"vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.",
                          VB_REQ, NB(VB_REQ)},
    [SERVE_VH_DECODE] = {"vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", VB_REQ,
                         NB(VB_REQ)},
    [SERVE_VH_INFERENCE] = {"vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request.",
                            VB_REQ, NB(VB_REQ)},
};
_Static_assert(NB(VB_TTFT) <= SERVE_VHIST_MAX && NB(VB_ITL) <= SERVE_VHIST_MAX && NB(VB_REQ) <= SERVE_VHIST_MAX,
               "serve_vhist holds every bucket");
/* vLLM's finished_reason label values, per serve_metrics.success index. */
static const char *REASON[3] = {"stop", "length", "abort"};

static void vhist_add(int k, double seconds)
{
    serve_vhist *h = &g_metrics.vh[k];
    int b = 0;
    while (b < VHIST[k].n && seconds > VHIST[k].b[b]) b++;
    h->count[b]++;
    h->sum += seconds;
    h->n++;
}

void serve_metrics_set_model(const char *model_name) { g_metrics.model_name = model_name; }

static const kipp_model *g_disk_model; /* the model whose disk tier /metrics reads (thread-safe stats) */
void serve_metrics_set_disk(const kipp_model *m) { g_disk_model = m; }
static const char *g_kv_type = "bf16";
static uint64_t g_kv_bytes_per_token;
void serve_metrics_set_kv(const char *kv_type, uint64_t bytes_per_token) { g_kv_type = kv_type, g_kv_bytes_per_token = bytes_per_token; }
void serve_metrics_on_start(uint64_t kv_capacity) { g_metrics.kv_capacity = kv_capacity; }
void serve_metrics_on_queue(int queued, int active) { g_metrics.queue_depth = queued, g_metrics.active_choices = active; }
void serve_metrics_on_kv(uint64_t blocks) { g_metrics.kv_blocks = blocks; }
/* Step phases span 100 us (sampling a few rows) to seconds (a long prefill chunk). */
static const double STEP_B[SERVE_STEP_BUCKETS] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                                  0.05,   0.1,     0.15,   0.2,   0.3,    0.5,   1,    2.5};
/* vllm:iteration_tokens_total's bounds (vllm/v1/metrics/loggers.py) */
static const double ITER_B[SERVE_ITER_BUCKETS] = {1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384};
static const char *PHASE[SERVE_STEP_PHASES] = {"plan", "engine", "sample", "lock", "publish"};

static void step_hist_add(serve_step_hist *h, double seconds)
{
    int b = 0;
    while (b < SERVE_STEP_BUCKETS && seconds > STEP_B[b]) b++;
    h->count[b]++;
    h->sum += seconds;
    h->n++;
}

void serve_metrics_on_step(const double phase[SERVE_STEP_PHASES], const serve_step_load *load, double target_s, int capped,
                           int burst, const double cost[4])
{
    double all = 0, tokens = load->decode_tokens + load->prefill_tokens;
    int dec = load->decode_tokens > 0, pre = load->prefill_tokens > 0;
    g_metrics.kind_steps[dec && pre ? 2 : pre ? 1 : 0]++;
    g_metrics.burst_steps += burst != 0;
    g_metrics.steps++;
    for (int i = 0; i < SERVE_STEP_PHASES; i++) step_hist_add(&g_metrics.phase[i], phase[i]), all += phase[i];
    step_hist_add(&g_metrics.step, all);
    int b = 0;
    while (b < SERVE_ITER_BUCKETS && tokens > ITER_B[b]) b++;
    g_metrics.iter_tokens[b]++;
    g_metrics.iter_sum += tokens;
    g_metrics.capped_steps += capped != 0;
    g_metrics.target_s = target_s;
    for (int i = 0; i < 4; i++) g_metrics.cost[i] = cost[i];
}
void serve_metrics_on_render(double seconds, size_t bytes) { g_metrics.render_s += seconds, g_metrics.renders += bytes > 0; }
void serve_metrics_on_preempt(void) { g_metrics.preemptions++; }
void serve_metrics_on_cancel(void) { g_metrics.cancelled++; }

void serve_metrics_on_running(int requests, int preempted_requests, int preempted_choices)
{
    g_metrics.running_requests = requests;
    g_metrics.preempted_requests = preempted_requests;
    g_metrics.preempted_choices = preempted_choices;
}

void serve_metrics_on_admit(uint64_t n_prompt, uint64_t cached)
{
    g_metrics.prompt_tokens += n_prompt;
    g_metrics.prompt_tokens_cached += cached;
}

void serve_metrics_on_pool(const kipp_pool_stats *st)
{
    g_metrics.pooled = 1;
    g_metrics.pool = *st;
    g_metrics.kv_blocks = st->blocks_private + st->blocks_referenced;
}

void serve_metrics_on_spec(uint64_t drafted, uint64_t accepted, uint64_t emitted)
{
    g_metrics.spec_steps++;
    g_metrics.spec_drafted += drafted;
    g_metrics.spec_accepted += accepted;
    g_metrics.spec_emitted += emitted;
}

void serve_metrics_on_token(int first, double seconds, uint32_t n_tokens, uint32_t n_refill)
{
    if (first >= 0) {
        serve_hist_add(first ? &g_metrics.ttft : &g_metrics.itl, seconds);
        vhist_add(first ? SERVE_VH_TTFT : SERVE_VH_ITL, seconds);
    }
    g_metrics.generated_tokens += n_tokens;
    g_metrics.recomputed_tokens += n_refill;
}

/* vLLM's phases of a finished request: queued (arrival to admission),
 * prefill (admission to first token), decode (first to last token),
 * inference (admission to last token), and end to end (arrival to finish). */
void serve_metrics_on_finish(int why, double t_arrive, double t_admit, double t_first, double t_last, double now)
{
    int r = why == FIN_STOP ? 0 : why == FIN_LENGTH ? 1 : why == FIN_CANCELLED ? 2 : -1;
    if (r < 0) return;
    g_metrics.success[r]++;
    vhist_add(SERVE_VH_E2E, now - t_arrive);
    if (t_admit <= 0) t_admit = now; /* ended while queued: all of it was waiting */
    vhist_add(SERVE_VH_QUEUE, t_admit - t_arrive);
    double first = t_first > 0 ? t_first : now, last = t_last > 0 ? t_last : now;
    vhist_add(SERVE_VH_PREFILL, first - t_admit);
    vhist_add(SERVE_VH_DECODE, last - first);
    vhist_add(SERVE_VH_INFERENCE, last - t_admit);
}

void serve_metrics_request(int chat, int status)
{
    int k = status < 300 ? 0 : status == 400 ? 1 : status == 404 ? 2 : status == 413 ? 3 : status == 429 ? 4 : 5;
    if (status >= 400 && status < 500 && k == 5) k = 1; /* other 4xx (405, 431) count with 400 */
    g_metrics.requests[chat ? 1 : 0][k]++;
}

static void put(serve_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#include <stdarg.h>
static void put(serve_buf *b, const char *fmt, ...)
{
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (n > 0) serve_buf_put(b, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
}

static void hist(serve_buf *b, const char *name, const char *help, const serve_hist *h)
{
    put(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (int i = 0; i < SERVE_HIST_BUCKETS; i++) {
        cum += h->count[i];
        put(b, "%s_bucket{le=\"%g\"} %llu\n", name, BOUNDS[i], (unsigned long long)cum);
    }
    cum += h->count[SERVE_HIST_BUCKETS];
    put(b, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", name, (unsigned long long)cum, name, h->sum,
        name, (unsigned long long)h->n);
}

static void gauge(serve_buf *b, const char *name, const char *help, const char *type, double v)
{
    put(b, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name, type, name, v);
}

/* The KV pool (seed 000 "Cross-session prefix sharing"): occupancy by block state, then reuse counters. */
static void pool_metrics(serve_buf *b, const kipp_pool_stats *p)
{
    const char *name[6] = {"total", "free", "private", "published", "referenced", "available"};
    const uint64_t v[6] = {p->blocks_total, p->blocks_free, p->blocks_private, p->blocks_published, p->blocks_referenced,
                           p->blocks_available};
    put(b, "# HELP kipp_kv_pool_blocks 32-position blocks of the shared KV pool by state (published = reusable by content, "
           "referenced = published and mapped by a live choice, available = free + unreferenced published).\n"
           "# TYPE kipp_kv_pool_blocks gauge\n");
    for (int i = 0; i < 6; i++) put(b, "kipp_kv_pool_blocks{state=\"%s\"} %llu\n", name[i], (unsigned long long)v[i]);
    gauge(b, "kipp_kv_pool_hits_total", "Pool blocks adopted as a prompt prefix instead of prefilled.", "counter", (double)p->hits);
    gauge(b, "kipp_kv_pool_misses_total", "Full prompt blocks looked up in the pool and not found.", "counter", (double)p->misses);
    gauge(b, "kipp_kv_pool_evictions_total", "Unreferenced published blocks reclaimed, least recently used first.", "counter",
          (double)p->evictions);
}

/* vLLM's gauge names, which the Gateway API inference extension, llm-d and
 * the vLLM router scrape to pick a replica: running and waiting requests, the
 * KV cache's used fraction (0..1; published blocks no live choice references
 * count as free, as vLLM counts its cached-but-free blocks), and the cache
 * configuration as an info gauge. */
static void vllm_metrics(serve_buf *b, const serve_metrics *m)
{
    const char *model = m->model_name ? m->model_name : "";
    double cap = m->pooled ? (double)m->pool.blocks_total : (double)m->kv_capacity;
    double used = m->pooled ? (double)(m->pool.blocks_total - m->pool.blocks_available) : (double)m->kv_blocks;
    double perc = cap > 0 ? used / cap : 0;
    put(b, "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
           "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"%s\"} %d\n", model,
        m->running_requests);
    put(b, "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
           "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name=\"%s\"} %d\n", model,
        m->queue_depth + m->preempted_requests);
    put(b, "# HELP vllm:num_preemptions_total Cumulative number of preemptions from the engine.\n"
           "# TYPE vllm:num_preemptions_total counter\nvllm:num_preemptions_total{model_name=\"%s\"} %llu\n", model,
        (unsigned long long)m->preemptions);
    put(b, "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n"
           "# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{model_name=\"%s\"} %.17g\n", model, perc);
    put(b, "# HELP vllm:gpu_cache_usage_perc KV-cache usage (the older name of vllm:kv_cache_usage_perc).\n"
           "# TYPE vllm:gpu_cache_usage_perc gauge\nvllm:gpu_cache_usage_perc{model_name=\"%s\"} %.17g\n", model, perc);
    put(b, "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig.\n# TYPE vllm:cache_config_info gauge\n"
           "vllm:cache_config_info{block_size=\"32\",enable_prefix_caching=\"%s\",num_gpu_blocks=\"%llu\"} 1\n",
        m->pooled ? "True" : "False", (unsigned long long)(m->pooled ? m->pool.blocks_total : m->kv_capacity));
}

/* One of vLLM's histograms with its label set (model_name, engine) and bounds
 * written as prometheus_client writes them ("1.0", "0.075"). */
static void vllm_hist(serve_buf *b, const char *model, int k, const serve_vhist *h)
{
    const char *name = VHIST[k].name;
    put(b, "# HELP %s %s\n# TYPE %s histogram\n", name, VHIST[k].help, name);
    uint64_t cum = 0;
    for (int i = 0; i < VHIST[k].n; i++) {
        double v = VHIST[k].b[i];
        cum += h->count[i];
        put(b, v == (double)(long long)v ? "%s_bucket{model_name=\"%s\",engine=\"0\",le=\"%.1f\"} %llu\n"
                                         : "%s_bucket{model_name=\"%s\",engine=\"0\",le=\"%g\"} %llu\n",
            name, model, v, (unsigned long long)cum);
    }
    cum += h->count[VHIST[k].n];
    put(b, "%s_bucket{model_name=\"%s\",engine=\"0\",le=\"+Inf\"} %llu\n", name, model, (unsigned long long)cum);
    put(b, "%s_count{model_name=\"%s\",engine=\"0\"} %llu\n%s_sum{model_name=\"%s\",engine=\"0\"} %.9f\n", name, model,
        (unsigned long long)h->n, name, model, h->sum);
}

/* vLLM's request counters and histograms, under its names and label sets, so
 * dashboards built for vLLM read kipp-serve: token counters as the replies'
 * usage counts them, finished choices by finished_reason, and the latency
 * histograms (per choice, as vLLM counts each of n's child requests). */
static void vllm_requests(serve_buf *b, const serve_metrics *m)
{
    const char *model = m->model_name ? m->model_name : "";
    put(b, "# HELP vllm:prompt_tokens_total Number of prefill tokens processed.\n# TYPE vllm:prompt_tokens_total counter\n"
           "vllm:prompt_tokens_total{model_name=\"%s\",engine=\"0\"} %llu\n", model, (unsigned long long)m->prompt_tokens);
    put(b, "# HELP vllm:generation_tokens_total Number of generation tokens processed.\n"
           "# TYPE vllm:generation_tokens_total counter\n"
           "vllm:generation_tokens_total{model_name=\"%s\",engine=\"0\"} %llu\n", model, (unsigned long long)m->generated_tokens);
    put(b, "# HELP vllm:request_success_total Count of successfully processed requests.\n"
           "# TYPE vllm:request_success_total counter\n");
    for (int r = 0; r < 3; r++)
        put(b, "vllm:request_success_total{model_name=\"%s\",engine=\"0\",finished_reason=\"%s\"} %llu\n", model, REASON[r],
            (unsigned long long)m->success[r]);
    for (int k = 0; k < SERVE_VH_COUNT; k++) vllm_hist(b, model, k, &m->vh[k]);
}

/* One kipp_step_* histogram; label: "" or one pair such as phase="engine". */
static void step_hist(serve_buf *b, const char *name, const char *label, const serve_step_hist *h)
{
    const char *sep = label[0] ? "," : "", *open = label[0] ? "{" : "", *close = label[0] ? "}" : "";
    uint64_t cum = 0;
    for (int i = 0; i <= SERVE_STEP_BUCKETS; i++) {
        char le[32];
        cum += h->count[i];
        if (i < SERVE_STEP_BUCKETS) snprintf(le, sizeof le, "%g", STEP_B[i]);
        else snprintf(le, sizeof le, "+Inf");
        put(b, "%s_bucket{%s%sle=\"%s\"} %llu\n", name, label, sep, le, (unsigned long long)cum);
    }
    put(b, "%s_sum%s%s%s %.6f\n%s_count%s%s%s %llu\n", name, open, label, close, h->sum, name, open, label, close,
        (unsigned long long)h->n);
}

/* Where a scheduler step's time goes (the phases of sched.c's step), the
 * whole step, the tokens per step under vLLM's name, and the stall-free
 * planner's state: its time target, the steps it capped, the fitted costs. */
static void step_metrics(serve_buf *b, const serve_metrics *m)
{
    const char *model = m->model_name ? m->model_name : "";
    put(b, "# HELP kipp_step_seconds Scheduler step time by phase: plan and publish hold the lock, engine is "
           "kipp_eval_batch, sample is sampling + detokenizing + stop strings, lock is waiting for HTTP threads.\n"
           "# TYPE kipp_step_seconds histogram\n");
    for (int i = 0; i < SERVE_STEP_PHASES; i++) {
        char label[32];
        snprintf(label, sizeof label, "phase=\"%s\"", PHASE[i]);
        step_hist(b, "kipp_step_seconds", label, &m->phase[i]);
    }
    put(b, "# HELP kipp_step_total_seconds Scheduler step time, all phases (what a decoding stream waits per token).\n"
           "# TYPE kipp_step_total_seconds histogram\n");
    step_hist(b, "kipp_step_total_seconds", "", &m->step);
    put(b, "# HELP vllm:iteration_tokens_total Histogram of number of tokens per engine_step.\n"
           "# TYPE vllm:iteration_tokens_total histogram\n");
    uint64_t cum = 0;
    for (int i = 0; i < SERVE_ITER_BUCKETS; i++)
        cum += m->iter_tokens[i], put(b, "vllm:iteration_tokens_total_bucket{model_name=\"%s\",engine=\"0\",le=\"%.1f\"} %llu\n",
                                      model, ITER_B[i], (unsigned long long)cum);
    cum += m->iter_tokens[SERVE_ITER_BUCKETS];
    put(b, "vllm:iteration_tokens_total_bucket{model_name=\"%s\",engine=\"0\",le=\"+Inf\"} %llu\n", model, (unsigned long long)cum);
    put(b, "vllm:iteration_tokens_total_count{model_name=\"%s\",engine=\"0\"} %llu\n"
           "vllm:iteration_tokens_total_sum{model_name=\"%s\",engine=\"0\"} %.1f\n", model, (unsigned long long)m->steps, model,
        m->iter_sum);
    gauge(b, "kipp_step_target_seconds", "The latest step's time target (--step-ms), 0 when none applied.", "gauge", m->target_s);
    gauge(b, "kipp_step_prefill_capped_total", "Steps whose prefill share the time target cut below the token budget's.",
          "counter", (double)m->capped_steps);
    static const char *const kind[3] = {"decode", "prefill", "mixed"};
    put(b, "# HELP kipp_step_kind_total Scheduler steps that evaluated decode items only, prompt chunks only (nothing "
           "was decoding), or both.\n# TYPE kipp_step_kind_total counter\n");
    for (int i = 0; i < 3; i++) put(b, "kipp_step_kind_total{kind=\"%s\"} %llu\n", kind[i], (unsigned long long)m->kind_steps[i]);
    gauge(b, "kipp_http_render_seconds_total", "Seconds HTTP threads spent rendering stream events (SSE encoding) under "
          "the scheduler lock, beside the steps (per step: divide by kipp_scheduler_steps_total).", "counter", m->render_s);
    gauge(b, "kipp_http_renders_total", "Stream renders that produced bytes (about one per streaming choice per step).",
          "counter", (double)m->renders);
    gauge(b, "kipp_step_prefill_burst_total", "Mixed steps whose prompts were a burst (at least as many prefilling as "
          "decoding choices): they took the token budget, not the time target.", "counter", (double)m->burst_steps);
    const char *term[4] = {"base", "decode_token", "prefill_token", "attention_kpair"};
    put(b, "# HELP kipp_step_cost_seconds The step-cost fit: seconds per step (base), per decode token, per prefill "
           "token, per 1024 attention pairs.\n# TYPE kipp_step_cost_seconds gauge\n");
    for (int i = 0; i < 4; i++) put(b, "kipp_step_cost_seconds{term=\"%s\"} %.9g\n", term[i], m->cost[i]);
}

/* The KV disk tier (issue 54), read fresh: its I/O thread counts between steps. */
static void disk_metrics(serve_buf *b)
{
    kipp_disk_stats d;
    if (!g_disk_model || kipp_model_disk_stats(g_disk_model, &d)) return;
    gauge(b, "kipp_kv_disk_bytes", "Bytes of KV block files in --kv-cache-dir.", "gauge", (double)d.bytes);
    gauge(b, "kipp_kv_disk_capacity_bytes", "The disk tier's budget (--kv-cache-disk-mib).", "gauge", (double)d.max_bytes);
    gauge(b, "kipp_kv_disk_files", "KV block files in --kv-cache-dir.", "gauge", (double)d.files);
    gauge(b, "kipp_kv_disk_hits_total", "Blocks missing in RAM read back from disk at a prefix match.", "counter", (double)d.hits);
    gauge(b, "kipp_kv_disk_misses_total", "Full prompt blocks missing in RAM and on disk.", "counter", (double)d.misses);
    gauge(b, "kipp_kv_disk_reads_total", "Block files read and verified.", "counter", (double)d.reads);
    gauge(b, "kipp_kv_disk_read_bytes_total", "Bytes of block files read.", "counter", (double)d.read_bytes);
    gauge(b, "kipp_kv_disk_writes_total", "Block files written (write-through at publish).", "counter", (double)d.writes);
    gauge(b, "kipp_kv_disk_write_bytes_total", "Bytes of block files written.", "counter", (double)d.write_bytes);
    gauge(b, "kipp_kv_disk_rejects_total", "Block files refused at read: corrupt, truncated, another model, KV type or prefix.",
          "counter", (double)d.rejects);
    gauge(b, "kipp_kv_disk_dropped_total", "Writes not done: queue full, or the block reused before its turn.", "counter",
          (double)d.dropped);
    gauge(b, "kipp_kv_disk_write_errors_total", "Block file writes that failed.", "counter", (double)d.write_errors);
    gauge(b, "kipp_kv_disk_evictions_total", "Block files removed to stay within the budget, least recently used first.",
          "counter", (double)d.evictions);
    gauge(b, "kipp_kv_disk_tmp_removed_total", "Temporary files of an interrupted writer removed at start.", "counter",
          (double)d.tmp_removed);
    gauge(b, "kipp_kv_disk_queued", "Block writes waiting for the I/O thread.", "gauge", (double)d.queued);
}

void serve_metrics_on_rerank(uint64_t docs, const kipp_rerank_stats *st)
{
    uint64_t *r = g_metrics.rerank;
    r[SERVE_RR_REQUESTS]++, r[SERVE_RR_DOCUMENTS] += docs, r[SERVE_RR_PROMPT] += st->prompt_tokens;
    r[SERVE_RR_PREFIX_EVAL] += st->prefix_evaluated, r[SERVE_RR_PREFIX_REUSED] += st->prefix_reused;
    r[SERVE_RR_EVALUATED] += st->tokens_evaluated;
}

static void rerank_metrics(serve_buf *b, const serve_metrics *m)
{
    static const char *const name[6] = {"requests", "documents", "prompt_tokens", "prefix_tokens_evaluated",
                                         "prefix_tokens_reused", "tokens_evaluated"};
    static const char *const help[6] = {"Requests to /v1/rerank and /v1/score.", "Documents scored.",
                                        "Prompt tokens of the scored documents (template and query included).",
                                        "Positions of the shared query prefix evaluated (once per request when pooled).",
                                        "Document positions forked from the evaluated query prefix instead of evaluated.",
                                        "Positions evaluated for rerank and score requests."};
    char n[64];
    for (int i = 0; i < 6; i++) {
        snprintf(n, sizeof n, "kipp_rerank_%s_total", name[i]);
        gauge(b, n, help[i], "counter", (double)m->rerank[i]);
    }
}

char *serve_metrics_text(const serve_metrics *m)
{
    serve_buf b = {0};
    put(&b, "# HELP kipp_requests_total HTTP requests to the completion endpoints, by endpoint and status.\n"
            "# TYPE kipp_requests_total counter\n");
    for (int c = 0; c < 2; c++)
        for (int k = 0; k < 6; k++)
            put(&b, "kipp_requests_total{endpoint=\"%s\",status=\"%s\"} %llu\n", c ? "chat" : "completions", STATUS[k],
                (unsigned long long)m->requests[c][k]);
    gauge(&b, "kipp_prompt_tokens_total", "Prompt tokens admitted (per request).", "counter", (double)m->prompt_tokens);
    gauge(&b, "kipp_generation_tokens_total", "Tokens generated, all choices.", "counter", (double)m->generated_tokens);
    gauge(&b, "kipp_cancelled_total", "Requests cancelled because the client went away.", "counter", (double)m->cancelled);
    gauge(&b, "kipp_scheduler_steps_total", "Scheduler steps (one kipp_eval_batch each).", "counter", (double)m->steps);
    hist(&b, "kipp_time_to_first_token_seconds", "Arrival to first generated token, per choice.", &m->ttft);
    hist(&b, "kipp_inter_token_latency_seconds", "Time between consecutive tokens of a choice.", &m->itl);
    gauge(&b, "kipp_queue_depth", "Requests waiting in the FIFO.", "gauge", m->queue_depth);
    gauge(&b, "kipp_active_choices", "Choices being evaluated.", "gauge", m->active_choices);
    gauge(&b, "kipp_kv_blocks_in_use", "32-position KV blocks held by live sessions.", "gauge", (double)m->kv_blocks);
    gauge(&b, "kipp_prompt_tokens_cached_total", "Prompt tokens adopted from the KV pool instead of prefilled.", "counter",
          (double)m->prompt_tokens_cached);
    put(&b, "# HELP kipp_kv_bytes_per_token KV cache bytes per cached token, all layers, K and V, in the cache's type (--kv-type).\n"
            "# TYPE kipp_kv_bytes_per_token gauge\nkipp_kv_bytes_per_token{kv_type=\"%s\"} %llu\n", g_kv_type,
        (unsigned long long)g_kv_bytes_per_token);
    if (m->pooled) pool_metrics(&b, &m->pool);
    disk_metrics(&b);
    gauge(&b, "kipp_preemptions_total", "Choices whose session was taken to free KV blocks (recomputed later).", "counter",
          (double)m->preemptions);
    gauge(&b, "kipp_recomputed_tokens_total", "Positions evaluated again after a preemption.", "counter",
          (double)m->recomputed_tokens);
    gauge(&b, "kipp_preempted_choices", "Preempted choices waiting to resume.", "gauge", m->preempted_choices);
    gauge(&b, "kipp_spec_steps_total", "Speculative decode steps (one verification each) of greedy choices.", "counter",
          (double)m->spec_steps);
    gauge(&b, "kipp_spec_drafted_tokens_total", "Draft tokens verified.", "counter", (double)m->spec_drafted);
    gauge(&b, "kipp_spec_accepted_tokens_total", "Draft tokens accepted (equal to the greedy token).", "counter",
          (double)m->spec_accepted);
    gauge(&b, "kipp_spec_emitted_tokens_total", "Tokens emitted by speculative steps.", "counter", (double)m->spec_emitted);
    step_metrics(&b, m);
    rerank_metrics(&b, m);
    vllm_metrics(&b, m);
    vllm_requests(&b, m);
    return b.p;
}
