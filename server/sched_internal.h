/*
 * sched_internal.h - the scheduler's private state, shared by sched.c (the
 * step loop) and sched_embed.c (the side work its thread runs between steps:
 * embedding groups and serve_sched_run tasks). Nothing outside server/sched*.c
 * includes it; the public surface is serve.h's serve_sched_*.
 */
#ifndef KIPP_SERVER_SCHED_INTERNAL_H
#define KIPP_SERVER_SCHED_INTERNAL_H

#include "server/serve.h"
#include "server/step_cost.h"

/* One running choice of a job: its session, its generation and this step's item. */
typedef struct {
    serve_job *job;
    int idx;
    uint64_t seq;             /* admission order: prefill chunks go oldest first */
    kipp_session *s;          /* NULL while preempted: g is never stepped until kipp_gen_rebind */
    kipp_gen *g;              /* sampling, history, stops, detokenizer, drafter */
    uint32_t held;            /* positions its session held when preempted (echo rows were given for these) */
    int echo;                 /* 1: prompt rows get logits (echo + logprobs) */
    kipp_batch_item it;       /* this step's item; token_count 0 = none */
    size_t text_pos;          /* bytes of the gen's text before its next token (logprob offsets) */
    /* kipp_gen_advance's outcome, computed outside `mu` and published under it */
    int adv_rc;
    kipp_gen_event ev;
    uint64_t spec_d[3];       /* drafted, accepted, emitted by this step when it was a speculative one */
    int spec_step;
    char err[256];
} sched_choice;

struct serve_sched {
    kipp_model *m;
    kipp_model_info info;
    serve_sched_opts o;
    pthread_mutex_t mu, tok;
    pthread_cond_t cv;
    pthread_t th;
    int stop, started;
    serve_job *head, *tail;
    int n_queued;
    sched_choice *act[SERVE_MAX_BATCH];
    int n_act;
    uint64_t seed_salt;
    uint64_t n_finished;      /* choices finished so far: pool room can only grow when this moves */
    uint64_t n_admitted;      /* choices admitted so far: their seq */
    uint64_t n_preempted;     /* choices preempted so far: pool room can have grown when this moves */
    uint64_t kv_held;         /* unpooled: KV blocks of the budget the live sessions hold */
    serve_job *blocked;       /* head job last refused for pool room, retried once n_finished moves */
    uint64_t blocked_at;      /* n_finished at that refusal */
    int end_all;              /* drain: end every running and queued job at the next step boundary */
    serve_task *tasks, *tasks_tail; /* serve_sched_run's queue, run between steps */
    int resume_waits;         /* the oldest preempted choice did not fit at resume_at */
    uint64_t resume_at;       /* n_finished + preemptions then: room can only have grown when this moves */
    serve_cost_model cost;    /* the step-cost fit (step_cost.h): only the scheduler thread touches it */
    serve_step_load load;     /* what the planned step evaluates */
    double target_s;          /* its time target (0 = none applied) */
    int capped;               /* 1: the target cut its prefill share below the token budget's */
    int burst;                /* 1: it decodes beside a burst of prompts, which take the token budget (serve_step_burst) */
    serve_embed_queue eq;     /* embedding requests (sched_embed.c), run between steps */
};

/** The scheduler's snapshot of the KV pool for /metrics (mu held). */
void serve_sched_pool_snapshot(serve_sched *s);
/** One group of the oldest embedding request (mu held; released while it runs): all of it while nothing
 * generates (up to SERVE_EMBED_IDLE_TOKENS), else the step's token budget capped at SERVE_EMBED_BUSY_TOKENS. */
void serve_sched_embed_turn(serve_sched *s);
/** Run the queued serve_sched_run tasks (mu held on entry and exit; released while each runs). */
void serve_sched_run_tasks(serve_sched *s);

#endif
