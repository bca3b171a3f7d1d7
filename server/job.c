/*
 * job.c - a request's job: creation, references, and the id clients see
 * (serve_job.pub_id): an API's prefix and 24 random base62 characters, so ids
 * stay unique across processes, replicas and restarts (sequential
 * per-process ids repeat after every restart).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "server/serve.h"

/* Fill b[n] with random bytes: getrandom(), or, where the kernel lacks it, a
 * splitmix64 stream seeded with the clock, the pid and a counter (still
 * distinct across processes, though not secret). */
static void random_bytes(unsigned char *b, size_t n)
{
    size_t got = 0;
    for (ssize_t r; got < n && (r = getrandom(b + got, n - got, 0)) > 0;) got += (size_t)r;
    if (got == n) return;
    static uint64_t ctr;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t x = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^ ((uint64_t)getpid() << 44) ^
                 __atomic_add_fetch(&ctr, 0x9e3779b97f4a7c15ull, __ATOMIC_RELAXED);
    for (; got < n; got++) {
        uint64_t z = (x += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        b[got] = (unsigned char)(z ^ (z >> 31));
    }
}

void serve_job_set_id(serve_job *j, const char *prefix)
{
    static const char B62[] = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    unsigned char r[24];
    size_t p = strnlen(prefix, 16);
    random_bytes(r, sizeof r);
    memcpy(j->pub_id, prefix, p);
    for (size_t i = 0; i < sizeof r; i++) j->pub_id[p + i] = B62[r[i] % 62]; /* 256 % 62 != 0: a slight bias, which ids can bear */
    j->pub_id[p + sizeof r] = 0;
}

serve_job *serve_job_new(serve_req *req)
{
    static uint64_t next_id = 1;
    serve_job *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    j->req = *req;
    memset(req, 0, sizeof *req);
    j->id = __atomic_fetch_add(&next_id, 1, __ATOMIC_RELAXED);
    /* each API's own id prefix, so the access log writes what the client received */
    static const char *const prefix[] = {[SERVE_API_OPENAI] = "chatcmpl-", [SERVE_API_ANTHROPIC] = "msg_",
                                         [SERVE_API_RESPONSES] = "resp_"};
    serve_job_set_id(j, j->req.chat || j->req.api != SERVE_API_OPENAI ? prefix[j->req.api] : "cmpl-");
    j->created = (int64_t)time(NULL);
    j->t_arrive = serve_now();
    j->refs = 1;
    return j;
}

void serve_job_unref(serve_job *j)
{
    if (!j || --j->refs > 0) return;
    for (int i = 0; i < SERVE_MAX_N; i++) serve_buf_free(&j->out[i].raw), free(j->out[i].lp), free(j->out[i].tok_off);
    free(j->prompt_top);
    serve_req_free(&j->req);
    free(j);
}
