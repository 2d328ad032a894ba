/* SipHash-2-4 (Aumasson and Bernstein, 2012): a keyed 64-bit hash, for
 * tables a client's bytes choose the place in. */
#ifndef SIPHASH_H
#define SIPHASH_H

#include <stddef.h>
#include <stdint.h>

uint64_t siphash24(const uint64_t key[2], const void *data, size_t len);

#endif
