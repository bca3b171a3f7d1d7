/*
 * responses_store.c - the in-memory store behind previous_response_id.
 *
 * Bounded: at most SERVE_RESP_STORE_MAX responses and SERVE_RESP_STORE_BYTES
 * of their items' compact JSON, the least recently used (stored, continued or retrieved)
 * evicted first. Each entry holds the Response object (GET /v1/responses/{id})
 * and the whole conversation up to and including its output, so a chain of follow-ups costs the sum of its prefixes; the byte
 * bound keeps that finite. Nothing survives a restart, and replicas do not
 * share it: a follow-up sent to another process gets "not found". One mutex
 * guards the list (HTTP handlers run on several threads); it is never held
 * while taking another lock.
 */
#include <stdlib.h>
#include <string.h>

#include "server/responses.h"

typedef struct entry {
    char id[48];
    json_t *items;            /* the conversation, for previous_response_id */
    json_t *response;         /* the Response object, for GET /v1/responses/{id} */
    size_t bytes;             /* both as compact JSON */
    struct entry *prev, *next; /* most recently used first */
} entry;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static entry *head, *tail;
static size_t n_entries, n_bytes;

static void unlink_entry(entry *x)
{
    if (x->prev) x->prev->next = x->next;
    else head = x->next;
    if (x->next) x->next->prev = x->prev;
    else tail = x->prev;
    x->prev = x->next = NULL;
}

static void push_front(entry *x)
{
    x->next = head, x->prev = NULL;
    if (head) head->prev = x;
    head = x;
    if (!tail) tail = x;
}

static void drop(entry *x)
{
    unlink_entry(x);
    n_entries--, n_bytes -= x->bytes;
    json_decref(x->items), json_decref(x->response);
    free(x);
}

static entry *find(const char *id)
{
    for (entry *x = head; x; x = x->next)
        if (!strcmp(x->id, id)) return x;
    return NULL;
}

static size_t json_bytes(const json_t *v)
{
    char *text = json_dumps(v, JSON_COMPACT);
    size_t n = text ? strlen(text) : 0;
    free(text);
    return n;
}

int serve_resp_store_put(const char *id, json_t *items, json_t *response)
{
    size_t bytes = json_bytes(items) + json_bytes(response);
    entry *x = items && response && strlen(id) < sizeof x->id && bytes <= SERVE_RESP_STORE_BYTES ? calloc(1, sizeof *x) : NULL;
    if (!x) {
        json_decref(items), json_decref(response);
        return -1;
    }
    strcpy(x->id, id);
    x->items = items, x->response = response, x->bytes = bytes;
    pthread_mutex_lock(&mu);
    entry *old = find(id);
    if (old) drop(old);
    while (head && (n_entries + 1 > SERVE_RESP_STORE_MAX || n_bytes + bytes > SERVE_RESP_STORE_BYTES)) drop(tail);
    push_front(x);
    n_entries++, n_bytes += bytes;
    pthread_mutex_unlock(&mu);
    return 0;
}

/* A deep copy of entry id's items (response 0) or Response (1), marking it used; NULL when absent. */
static json_t *get(const char *id, int response)
{
    pthread_mutex_lock(&mu);
    entry *x = find(id);
    json_t *copy = NULL;
    if (x) {
        unlink_entry(x), push_front(x);
        copy = json_deep_copy(response ? x->response : x->items);
    }
    pthread_mutex_unlock(&mu);
    return copy;
}

json_t *serve_resp_store_get(const char *id) { return get(id, 0); }

json_t *serve_resp_store_response(const char *id) { return get(id, 1); }

int serve_resp_store_delete(const char *id)
{
    pthread_mutex_lock(&mu);
    entry *x = find(id);
    if (x) drop(x);
    pthread_mutex_unlock(&mu);
    return x != NULL;
}
