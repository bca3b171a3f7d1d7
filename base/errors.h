/*
 * errors.h - the KIPP_E* error codes every layer returns (docs/ARCHITECTURE.md
 * "Errors"). Part of the public API: engine/kipp.h includes this file, so a
 * client sees the same codes; backends and kernels include it directly instead
 * of the whole engine header. base/ is the floor: this file includes nothing of ours.
 */
#ifndef KIPP_BASE_ERRORS_H
#define KIPP_BASE_ERRORS_H

#ifdef __cplusplus
extern "C" {
#endif

#define KIPP_OK 0
#define KIPP_EINVAL (-1)   /* bad argument value */
#define KIPP_EIO (-2)      /* open/read/mmap failed */
#define KIPP_EFORMAT (-3)  /* malformed or rejected model file */
#define KIPP_ENOMEM (-4)   /* allocation failed */
#define KIPP_ERANGE (-5)   /* capacity, position or token id out of range */
#define KIPP_EBACKEND (-6) /* unknown backend or backend failure */
#define KIPP_ENOTSUP (-7)  /* feature not available for this checkpoint/backend */
#define KIPP_ENUMERIC (-8) /* NaN or Inf where finite values are required */

/** Short name of an error code ("EINVAL", ...); never NULL (base/errors.c). */
const char *kipp_strerror(int code);

#ifdef __cplusplus
}
#endif

#endif
