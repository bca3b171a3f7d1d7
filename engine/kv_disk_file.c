/*
 * kv_disk_file.c - the header of a disk-tier block file (kv_disk.h): encode
 * and check. Offsets (little-endian):
 *    0 magic "KIPPKVB1"   8 u32 version (1)   12 u32 kv_type   16 model_id[16]
 *   32 u32 block_tokens  36 u32 n_seg        40 u32 seg_bytes  44 u32 has_parent
 *   48 u64 chain hash    56 u64 parent hash  64 u32 n_ids      68 u32 0
 *   72 u64 payload XXH3_64   80..119 zero    120 u64 XXH3_64 of bytes 0..119 and the ids
 */
#include <stdio.h>
#include <string.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>

#include "engine/kv_disk.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "block files are little-endian, written from memory");

static const char MAGIC[8] = {'K', 'I', 'P', 'P', 'K', 'V', 'B', '1'};
enum { VERSION = 1, SUM_AT = 120 };

uint64_t kipp_kv_file_size(uint32_t n_ids, uint32_t n_seg, size_t seg_bytes)
{
    return KIPP_KV_FILE_HEAD + (uint64_t)n_ids * 4 + (uint64_t)n_seg * seg_bytes;
}

static void put32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void put64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
static uint32_t get32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static uint64_t get64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }

/* XXH3_64 of the header's first SUM_AT bytes followed by the ids. */
static uint64_t head_sum(const uint8_t *raw, const uint32_t *ids, uint32_t n_ids)
{
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    XXH3_64bits_update(&st, raw, SUM_AT);
    XXH3_64bits_update(&st, ids, (size_t)n_ids * 4);
    return XXH3_64bits_digest(&st);
}

void kipp_kv_file_encode(const kipp_kv_file_head *h, const uint32_t *ids, uint8_t out[KIPP_KV_FILE_HEAD])
{
    memset(out, 0, KIPP_KV_FILE_HEAD);
    memcpy(out, MAGIC, 8);
    put32(out + 8, VERSION);
    put32(out + 12, h->kv_type);
    memcpy(out + 16, h->model_id, 16);
    put32(out + 32, h->block_tokens);
    put32(out + 36, h->n_seg);
    put32(out + 40, h->seg_bytes);
    put32(out + 44, h->has_parent);
    put64(out + 48, h->hash);
    put64(out + 56, h->parent_hash);
    put32(out + 64, h->n_ids);
    put64(out + 72, h->payload_xxh);
    put64(out + SUM_AT, head_sum(out, ids, h->n_ids));
}

#define WHY(...) (snprintf(why, whylen, __VA_ARGS__), -1)

int kipp_kv_file_check(const uint8_t raw[KIPP_KV_FILE_HEAD], const uint32_t *file_ids, const kipp_kv_file_head *want,
                       const uint32_t *ids, uint64_t *payload_xxh, char *why, size_t whylen)
{
    if (memcmp(raw, MAGIC, 8) || get32(raw + 8) != VERSION)
        return WHY("not a version-%d Kipp KV block file (magic/version differ)", VERSION);
    if (get32(raw + 64) != want->n_ids) return WHY("holds a %u-token prefix, expected %u", get32(raw + 64), want->n_ids);
    if (get64(raw + SUM_AT) != head_sum(raw, file_ids, want->n_ids)) return WHY("header checksum mismatch (corrupt)");
    if (memcmp(raw + 16, want->model_id, 16)) return WHY("written for another model (model identity differs)");
    if (get32(raw + 12) != want->kv_type)
        return WHY("KV type %u (%s), expected %u (%s): another --kv-type", get32(raw + 12),
                   kipp_kv_type_name((int)get32(raw + 12) - 1), want->kv_type, kipp_kv_type_name((int)want->kv_type - 1));
    if (get32(raw + 32) != want->block_tokens || get32(raw + 36) != want->n_seg || get32(raw + 40) != want->seg_bytes)
        return WHY("block layout %u tokens x %u segments x %u bytes, expected %u x %u x %u", get32(raw + 32),
                   get32(raw + 36), get32(raw + 40), want->block_tokens, want->n_seg, want->seg_bytes);
    if (get64(raw + 48) != want->hash || get32(raw + 44) != want->has_parent ||
        (want->has_parent && get64(raw + 56) != want->parent_hash))
        return WHY("chain hash or parent differs from the file's name");
    if (memcmp(file_ids, ids, (size_t)want->n_ids * 4)) return WHY("another prompt prefix (token ids differ)");
    *payload_xxh = get64(raw + 72);
    return 0;
}
