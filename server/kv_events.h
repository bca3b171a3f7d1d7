/*
 * kv_events.h - KV pool events in vLLM's KV-events wire format
 * (`--kv-events`): msgpack over a ZeroMQ PUB socket, so a prefix-aware router that
 * subscribes to vLLM replicas (llm-d's KV cache indexer, the Gateway API
 * inference extension) can index a Kipp replica's prefix cache too.
 *
 * Wire format (vllm/distributed/kv_events.py, msgspec array_like structs,
 * tagged unions as [tag, fields...]): each message is three frames
 *   topic (empty) | sequence number (8 bytes, big-endian, from 0) | payload
 * and the payload is a KVEventBatch
 *   [ts (float64 seconds since the epoch), [event...], data_parallel_rank (0)]
 * with events
 *   ["BlockStored", [hash...], parent_hash | nil, [token id...], 32, nil (lora_id), "CPU", nil (lora_name)]
 *   ["BlockRemoved", [hash...], "CPU"]
 *   ["AllBlocksCleared"]
 * That is vLLM's shape through its array_like releases, which llm-d's indexer
 * decodes. Later vLLM encodes the events as maps tagged by a "type" key
 * ({"type": "BlockStored", "block_hashes": ..., "medium": "CPU", ...}) in the
 * same array batch, which is what vllm-router's kv_aware index decodes;
 * --kv-events-format map selects that shape.
 * Consecutive stored blocks of one chain become one BlockStored (its token
 * ids are the blocks' ids in order), as vLLM sends a request's new blocks.
 * Hashes are Kipp's 64-bit chain hashes (kipp_kv_event), sent as integers,
 * as vLLM does by default. The medium is "CPU" for the RAM pool and "DISK" for
 * the disk tier (--kv-cache-dir): a block written there, or its file removed.
 *
 * The engine reports events through kipp_model_set_kv_listener on the
 * scheduler's thread; serve_kv_events_on_event only copies them into a queue,
 * and a dedicated thread encodes and sends, so a slow or absent subscriber
 * never stalls a step (a PUB socket drops at its high-water mark instead).
 */
#ifndef KIPP_KV_EVENTS_H
#define KIPP_KV_EVENTS_H

#include <stddef.h>
#include <stdint.h>

#include "engine/kipp.h"

typedef struct serve_kv_events serve_kv_events;

/** How structs are encoded: msgspec array_like (vLLM's first releases) or maps (newer vLLM). */
enum { SERVE_KV_EVENTS_ARRAY = 0, SERVE_KV_EVENTS_MAP = 1 };

/**
 * Check a --kv-events endpoint: "tcp://HOST:PORT" with HOST "*", an address
 * or a name, and PORT 1..65535. 0, or -1 with err naming the value and what
 * was expected.
 */
int serve_kv_events_check(const char *endpoint, char *err, size_t errlen);
/** serve_kv_events_check for the option flag (its name starts the message). */
int serve_kv_events_check_flag(const char *flag, const char *endpoint, char *err, size_t errlen);

/** What serve_kv_events_start opens. */
typedef struct {
    const char *endpoint; /* --kv-events: the PUB socket */
    const char *replay;   /* --kv-events-replay: a ROUTER socket for replay requests, or NULL */
    int format;           /* SERVE_KV_EVENTS_ARRAY or SERVE_KV_EVENTS_MAP */
} serve_kv_events_opts;

/**
 * Open the PUB socket and start the publishing thread. As vLLM does, an
 * endpoint whose host is "*" or an IPv6 wildcard ("::") is bound (subscribers
 * connect to this replica); any other is connected to (a subscriber that binds,
 * as llm-d's indexer does). NULL with err filled on a bad endpoint or a socket
 * error. With a replay endpoint the last batches sent are kept, and a
 * subscriber that saw a gap in the sequence numbers can ask for them again
 * as vLLM's replay protocol does (send [""] + the first missing seq as 8 bytes
 * big-endian from a REQ or DEALER socket; the answer is [seq, payload] per
 * batch, then [-1, ""]).
 */
serve_kv_events *serve_kv_events_start(const serve_kv_events_opts *opts, char *err, size_t errlen);

/** The kipp_kv_event_fn to register with ctx = the publisher: queues a copy of ev. */
void serve_kv_events_on_event(void *ctx, const kipp_kv_event *ev);

/**
 * Publish what is queued, stop the thread and close the socket (waiting up to
 * a second for queued messages to leave). NULL accepted.
 */
void serve_kv_events_stop(serve_kv_events *k);

/**
 * Encode events ev[n] as one KVEventBatch payload at time ts in format
 * (SERVE_KV_EVENTS_*) into a malloc'd buffer (*out, *out_len). 0, or -1 when
 * out of memory.
 */
int serve_kv_events_encode(const kipp_kv_event *ev, size_t n, double ts, int format, uint8_t **out, size_t *out_len);

#endif
