/*
 * names.h - one list of names, joined: the help texts and error messages that
 * list a table's names (backends, ISA levels, kernel formats) build the list
 * from the table itself, so a row added there shows up in every message and
 * none is written out by hand.
 */
#ifndef KIPP_NAMES_H
#define KIPP_NAMES_H

#include <stddef.h>

/**
 * Writes names[0, n) joined by sep ("ref, cpu" with sep ", ") into buf[len],
 * NUL-terminated and truncated to fit (len 0 writes nothing). Returns buf.
 */
const char *kipp_join_names(char *buf, size_t len, const char *const *names, size_t n, const char *sep);

#endif
