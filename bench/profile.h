/*
 * profile.h - the measurement loops of `make profile` (bench/profile.c): the
 * machine probes of kernels/cpu/probe.h, one file per ISA level there.
 */
#ifndef KIPP_BENCH_PROFILE_H
#define KIPP_BENCH_PROFILE_H

#include <stddef.h>
#include <stdint.h>

/* The read, FP32 FMA, BF16 dot and int8 dot loops live in kernels/cpu/probe.h, shared with the planner. */
#include "kernels/cpu/probe.h"

#endif
