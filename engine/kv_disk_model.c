/*
 * kv_disk_model.c - kipp_model_enable_disk_tier and kipp_model_disk_stats
 * (kipp.h; issue 54): the model identity a block file must carry, and the
 * wiring of the tier (engine/kv_disk.c) to the pool and the backend's slab.
 *
 * Model identity: XXH3_128 over every byte of the GGUF file (weights,
 * metadata, tokenizer), then the backend name and its kernel-path description
 * (a block computed by another kernel may differ in its last bits, and the
 * tier must keep results bitwise equal to a cold run). It is independent of
 * the file's path, and it costs one pass over the mapped file at startup
 * (memory bandwidth when the file is in the page cache; logged). Merged LoRA
 * adapters change the weights behind the file's back, so the tier refuses
 * them rather than hash them.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>

#include "base/errbuf.h"
#include "base/log.h"
#include "engine/internal.h"
#include "engine/kv_disk.h"
#include "engine/kv_pool.h"
#include "kernels/qwen3_shape.h"

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* The identity described above, into id[16]. */
static int model_identity(const kipp_model *m, uint8_t id[16])
{
    XXH3_state_t *st = XXH3_createState();
    if (!st) return -1;
    XXH3_128bits_reset(st);
    XXH3_128bits_update(st, m->map, m->map_size);
    char desc[4096] = "";
    if (m->ops->describe) m->ops->describe(m->bm, desc, sizeof desc);
    XXH3_128bits_update(st, m->ops->name, strlen(m->ops->name) + 1);
    XXH3_128bits_update(st, desc, strlen(desc));
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits_digest(st));
    memcpy(id, c.digest, 16);
    XXH3_freeState(st);
    return 0;
}

int kipp_model_enable_disk_tier(kipp_model *m, const char *dir, uint64_t max_mib, char *err, size_t errlen)
{
    if (!m || !dir || !*dir) return kipp_err(err, errlen, KIPP_EINVAL, "kipp_model_enable_disk_tier: NULL model or empty directory");
    if (!m->pool) return kipp_err(err, errlen, KIPP_EINVAL, "--kv-cache-dir needs the KV pool, which is off (--kv-pool-mib 0)");
    if (m->disk) return kipp_err(err, errlen, KIPP_EINVAL, "the model already has a KV disk tier");
    if (m->n_sessions)
        return kipp_err(err, errlen, KIPP_EINVAL, "a KV disk tier must be added before the first session; %u are open", m->n_sessions);
    if (m->n_lora)
        return kipp_err(err, errlen, KIPP_EINVAL, "--kv-cache-dir with --lora: the tier identifies a model by its file, and "
                        "%u merged adapter(s) change its weights; drop one of the two", m->n_lora);
    if (!m->ops->pool_block_seg)
        return kipp_err(err, errlen, KIPP_ENOTSUP, "backend \"%s\" keeps its KV pool outside host memory; the KV disk tier "
                        "needs \"cpu\" or \"ref\"", m->ops->name);
    kipp_model_info info;
    kipp_model_get_info(m, &info);
    size_t seg_bytes;
    m->ops->pool_block_seg(m->bm, 0, 0, &seg_bytes);
    kipp_kv_disk_opts o = {.dir = dir, .max_bytes = max_mib > (UINT64_MAX >> 20) ? UINT64_MAX : max_mib << 20,
                           .kv_type = KIPP_KV_DISK_TYPE(m->view.kv_type), .n_seg = 2 * info.n_layer, .seg_bytes = seg_bytes, .n_blocks = info.kv_pool_blocks,
                           .seg = m->ops->pool_block_seg, .backend_model = m->bm};
    double t0 = now_ms();
    if (model_identity(m, o.model_id)) return kipp_err(err, errlen, KIPP_ENOMEM, "out of memory hashing the model");
    double t1 = now_ms();
    int rc = kipp_kv_disk_open(&o, &m->disk, err, errlen);
    if (rc) return rc;
    kipp_kv_pool_set_reuse_hook(m->pool, kipp_kv_disk_on_reuse, m->disk);
    kipp_disk_stats st;
    kipp_kv_disk_stats(m->disk, &st);
    kipp_log("KV disk tier %s: %llu block files, %.1f of %.1f MiB (model identity: %.2f GiB hashed in %.0f ms)", dir,
             (unsigned long long)st.files, st.bytes / 1048576.0, st.max_bytes / 1048576.0, m->map_size / 1073741824.0,
             t1 - t0);
    return 0;
}

int kipp_model_disk_stats(const kipp_model *m, kipp_disk_stats *out)
{
    if (!m || !out) return KIPP_EINVAL;
    memset(out, 0, sizeof *out);
    if (!m->disk) return KIPP_ENOTSUP;
    kipp_kv_disk_stats(m->disk, out);
    return 0;
}
