/*
 * metrics.c - GET /metrics in the Prometheus text format 0.0.4: request
 * counts, token counts, TTFT and inter-token latency histograms, queue depth,
 * active choices, KV blocks held, and the KV pool's
 * occupancy and reuse counters, and vLLM's router gauges beside
 * them (vllm_metrics). All numbers are guarded by
 * the scheduler's mutex.
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

void serve_hist_add(serve_hist *h, double seconds)
{
    int b = 0;
    while (b < SERVE_HIST_BUCKETS && seconds > BOUNDS[b]) b++;
    h->count[b]++;
    h->sum += seconds;
    h->n++;
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
    if (m->pooled) pool_metrics(&b, &m->pool);
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
    vllm_metrics(&b, m);
    return b.p;
}
