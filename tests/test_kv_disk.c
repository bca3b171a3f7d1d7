/*
 * test_kv_disk.c - the KV disk tier (engine/kv_disk.h, issue 54) over a fake
 * slab in memory: a block written and read back is byte-identical; a file of
 * another prefix, another model or with a flipped payload byte is refused and
 * removed; a block the pool reuses is never written with its new bytes; the
 * LRU budget holds; temporary files are swept; an unsafe or locked directory
 * is refused. The oracle is the fake slab's own bytes.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/kv_disk.h"
#include "engine/kv_pool.h"
#include "tests/test_harness.h"

enum { NB = 8, NSEG = 4, SEG = 1024, NIDS = 32 };
static uint8_t slab[NB][NSEG][SEG];
static char root[64];
static uint32_t g_kv_type = KIPP_KV_DISK_BF16; /* the header's KV type open_dir asks for */

static void *seg_of(void *bm, uint32_t b, uint32_t seg, size_t *bytes)
{
    (void)bm;
    *bytes = SEG;
    return slab[b][seg];
}

static void fill(uint32_t b, unsigned seed)
{
    for (int s = 0; s < NSEG; s++)
        for (int i = 0; i < SEG; i++) slab[b][s][i] = (uint8_t)(seed * 31u + (unsigned)s * 7u + (unsigned)i * 13u);
}

static kipp_kv_disk *open_dir(const char *name, uint64_t max_bytes, uint8_t model_byte, char *err)
{
    kipp_kv_disk_opts o = {.max_bytes = max_bytes, .kv_type = g_kv_type, .n_seg = NSEG, .seg_bytes = SEG, .n_blocks = NB, .seg = seg_of};
    char path[128];
    snprintf(path, sizeof path, "%s/%s", root, name);
    o.dir = path;
    memset(o.model_id, model_byte, 16);
    kipp_kv_disk *d = NULL;
    err[0] = 0;
    kipp_kv_disk_open(&o, &d, err, 512);
    return d;
}

static void ids_for(uint32_t *ids, unsigned seed)
{
    for (int i = 0; i < NIDS; i++) ids[i] = 1000 + seed * 100 + (unsigned)i;
}

static void test_roundtrip_and_rejects(void)
{
    char err[512];
    uint32_t ids[NIDS], other[NIDS];
    ids_for(ids, 1), ids_for(other, 2);
    kipp_kv_disk *d = open_dir("a", 1 << 20, 7, err);
    CHECK(d != NULL, "open: %s", err);
    if (!d) return;
    fill(2, 1);
    kipp_kv_disk_put(d, 2, 0xabc, 0, 0, ids, NIDS);
    kipp_kv_disk_close(d); /* drains the queue */
    d = open_dir("a", 1 << 20, 7, err);
    CHECK(d && kipp_kv_disk_has(d, 0xabc), "reopened: the block is indexed (%s)", err);
    if (!d) return;
    memset(slab[5], 0, sizeof slab[5]);
    int got = kipp_kv_disk_get(d, 0xabc, 0, 0, ids, NIDS, 5);
    CHECK(got == 1 && !memcmp(slab[5], slab[2], sizeof slab[2]), "read back %d, bytes equal the written block", got);
    got = kipp_kv_disk_get(d, 0xabc, 0, 0, other, NIDS, 5);
    kipp_disk_stats st;
    kipp_kv_disk_stats(d, &st);
    CHECK(got == -1 && st.rejects == 1 && !kipp_kv_disk_has(d, 0xabc) && st.files == 0,
          "another prefix under the same hash is refused and removed: %d, %llu rejects", got, (unsigned long long)st.rejects);
    kipp_kv_disk_close(d);
}

static void test_foreign_model_and_corruption(void)
{
    char err[512], path[160];
    uint32_t ids[NIDS];
    ids_for(ids, 3);
    kipp_kv_disk *d = open_dir("b", 1 << 20, 1, err);
    if (!d) {
        CHECK(0, "open: %s", err);
        return;
    }
    fill(1, 2);
    kipp_kv_disk_put(d, 1, 0x111, 0, 0, ids, NIDS);
    kipp_kv_disk_put(d, 1, 0x222, 1, 0x111, ids, NIDS);
    kipp_kv_disk_close(d);
    d = open_dir("b", 1 << 20, 2, err); /* another model */
    if (!d) {
        CHECK(0, "reopen: %s", err);
        return;
    }
    CHECK(kipp_kv_disk_get(d, 0x111, 0, 0, ids, NIDS, 4) == -1, "a file of another model is refused");
    kipp_kv_disk_close(d);
    snprintf(path, sizeof path, "%s/b/%016x.kvb", root, 0x222);
    int fd = open(path, O_RDWR);
    uint8_t byte = 0;
    off_t at = (off_t)(KIPP_KV_FILE_HEAD + NIDS * 4 + 2 * SEG + 5);
    CHECK(fd >= 0 && pread(fd, &byte, 1, at) == 1, "open %s", path);
    byte ^= 1;
    CHECK(pwrite(fd, &byte, 1, at) == 1, "flip a payload byte");
    close(fd);
    d = open_dir("b", 1 << 20, 1, err);
    if (!d) {
        CHECK(0, "reopen: %s", err);
        return;
    }
    CHECK(kipp_kv_disk_get(d, 0x222, 1, 0x111, ids, NIDS, 4) == -1, "a flipped payload byte is refused");
    CHECK(kipp_kv_disk_get(d, 0x222, 1, 0x111, ids, NIDS, 4) == 0, "and its file is gone: a miss now");
    kipp_kv_disk_close(d);
}

/* A bf16 block file is refused (and removed) by a q8_0 tier of the same model and layout, and back. */
static void test_other_kv_type_refused(void)
{
    char err[512];
    uint32_t ids[NIDS];
    ids_for(ids, 4);
    kipp_kv_disk *d = open_dir("t", 1 << 20, 3, err);
    CHECK(d != NULL, "open: %s", err);
    if (!d) return;
    fill(3, 4);
    kipp_kv_disk_put(d, 3, 0x333, 0, 0, ids, NIDS);
    kipp_kv_disk_close(d);
    g_kv_type = KIPP_KV_DISK_Q8_0;
    d = open_dir("t", 1 << 20, 3, err);
    CHECK(d != NULL, "reopen as q8_0: %s", err);
    if (d) {
        kipp_disk_stats st;
        int got = kipp_kv_disk_get(d, 0x333, 0, 0, ids, NIDS, 6);
        kipp_kv_disk_stats(d, &st);
        CHECK(got == -1 && st.rejects == 1, "a bf16 file read by a q8_0 tier: %d, %llu rejects; expected -1, 1", got,
              (unsigned long long)st.rejects);
        fill(3, 5);
        kipp_kv_disk_put(d, 3, 0x334, 0, 0, ids, NIDS);
        kipp_kv_disk_close(d);
    }
    g_kv_type = KIPP_KV_DISK_BF16;
    d = open_dir("t", 1 << 20, 3, err);
    CHECK(d && kipp_kv_disk_get(d, 0x334, 0, 0, ids, NIDS, 6) == -1, "a q8_0 file read by a bf16 tier is refused");
    kipp_kv_disk_close(d);
}

/* The pool reuses a block whose writes are queued: no file may carry its new bytes. */
static void test_reuse_never_writes_new_bytes(void)
{
    char err[512];
    uint32_t ids[NIDS];
    ids_for(ids, 4);
    setenv("KIPP_TEST_KV_DISK_SLOW_MS", "5", 1);
    kipp_kv_disk *d = open_dir("c", 1 << 20, 3, err);
    unsetenv("KIPP_TEST_KV_DISK_SLOW_MS");
    if (!d) {
        CHECK(0, "open: %s", err);
        return;
    }
    fill(3, 9);
    for (uint64_t h = 1; h <= 20; h++) kipp_kv_disk_put(d, 3, h, 0, 0, ids, NIDS);
    kipp_kv_disk_on_reuse(d, 3);
    uint8_t old[NSEG][SEG];
    memcpy(old, slab[3], sizeof old);
    fill(3, 10); /* the block's next life */
    kipp_kv_disk_close(d);
    d = open_dir("c", 1 << 20, 3, err);
    if (!d) {
        CHECK(0, "reopen: %s", err);
        return;
    }
    kipp_disk_stats st;
    kipp_kv_disk_stats(d, &st);
    int wrong = 0, found = 0;
    for (uint64_t h = 1; h <= 20; h++) {
        if (kipp_kv_disk_get(d, h, 0, 0, ids, NIDS, 6) != 1) continue;
        found++;
        wrong += memcmp(slab[6], old, sizeof old) != 0;
    }
    CHECK(wrong == 0 && found == (int)st.files && found < 20, "%d of %d files hold the reused block's new bytes; %d written",
          wrong, found, found);
    kipp_kv_disk_close(d);
}

static void test_budget_and_tmp_sweep(void)
{
    char err[512], path[160];
    uint32_t ids[NIDS];
    ids_for(ids, 5);
    uint64_t one = kipp_kv_file_size(NIDS, NSEG, SEG);
    kipp_kv_disk *d = open_dir("d", one * 5 / 2, 4, err);
    if (!d) {
        CHECK(0, "open: %s", err);
        return;
    }
    for (uint64_t h = 1; h <= 4; h++) {
        fill(0, (unsigned)h);
        kipp_kv_disk_put(d, 0, h, 0, 0, ids, NIDS);
        kipp_kv_disk_on_reuse(d, KIPP_POOL_NONE); /* one at a time: each file newer than the last */
    }
    kipp_disk_stats st;
    kipp_kv_disk_stats(d, &st);
    CHECK(st.files == 2 && st.bytes == 2 * one && st.evictions == 2 && st.writes == 4,
          "budget of 2.5 files: %llu files, %llu evictions", (unsigned long long)st.files, (unsigned long long)st.evictions);
    CHECK(!kipp_kv_disk_has(d, 1) && !kipp_kv_disk_has(d, 2) && kipp_kv_disk_has(d, 3) && kipp_kv_disk_has(d, 4),
          "the least recently written went first");
    char err2[512];
    CHECK(open_dir("d", one * 4, 4, err2) == NULL && strstr(err2, "another kipp process"), "a second opener: %s", err2);
    kipp_kv_disk_close(d);
    snprintf(path, sizeof path, "%s/d/00000000000000aa.tmp", root);
    int fd = open(path, O_CREAT | O_WRONLY, 0600);
    close(fd);
    d = open_dir("d", one * 4, 4, err);
    if (!d) {
        CHECK(0, "reopen: %s", err);
        return;
    }
    kipp_kv_disk_stats(d, &st);
    CHECK(st.tmp_removed == 1 && access(path, F_OK) != 0, "a killed writer's temporary file is swept at start");
    kipp_kv_disk_close(d);
}

static void test_unsafe_dir_refused(void)
{
    char err[512], path[160];
    snprintf(path, sizeof path, "%s/e", root);
    mkdir(path, 0700);
    chmod(path, 0777);
    CHECK(open_dir("e", 1 << 20, 5, err) == NULL && strstr(err, "writable by others"), "world-writable: %s", err);
    chmod(path, 0720);
    CHECK(open_dir("e", 1 << 20, 5, err) == NULL && strstr(err, "mode 720"), "group-writable: %s", err);
    chmod(path, 0700);
    CHECK(open_dir("e", 100, 5, err) == NULL && strstr(err, "hold no block file"), "a budget below one file: %s", err);
    snprintf(path, sizeof path, "%s/f", root);
    kipp_kv_disk *d = open_dir("f", 1 << 20, 5, err);
    struct stat sb;
    CHECK(d && !stat(path, &sb) && (sb.st_mode & 0777) == 0700, "created 0700: %o", (unsigned)(sb.st_mode & 0777));
    kipp_kv_disk_close(d);
}

int main(void)
{
    snprintf(root, sizeof root, "/tmp/kipp-test-kv-disk-XXXXXX");
    if (!mkdtemp(root)) return perror("mkdtemp"), 1;
    umask(022);
    RUN(test_roundtrip_and_rejects);
    RUN(test_other_kv_type_refused);
    RUN(test_foreign_model_and_corruption);
    RUN(test_reuse_never_writes_new_bytes);
    RUN(test_budget_and_tmp_sweep);
    RUN(test_unsafe_dir_refused);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", root);
    return th_finish();
}
