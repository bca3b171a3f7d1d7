/*
 * read_probe.h - all-core read bandwidth probed now, for kipp-bench's decode rows.
 */
#ifndef KIPP_BENCH_READ_PROBE_H
#define KIPP_BENCH_READ_PROBE_H

/** All-core read GB/s (1e9 B/s) measured now by `kipp_profile --read-bw
 * --buffer-mib 256`, found next to the running binary (build/kipp-bench ->
 * build/bin/kipp_profile), or 0 after a note on stderr naming the probe
 * ("read probe <when>") and why it failed: it cannot execute, exits non-zero,
 * prints something unexpected, or gives no answer within 60 s (then it is
 * killed with its process group). A separate process, so its buffer stays out
 * of the caller's peak RSS; the caller's worker threads stay parked meanwhile.
 * Why it exists: a shared VM's memory speed can drift by 2x within minutes,
 * so decode shares are taken against probes beside each repetition
 * rather than against the profile alone. */
double kipp_read_probe(const char *when);

#endif
