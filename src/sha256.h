/* SHA-256 (FIPS 180-4), for hashing long client keys into Redis key names. */
#ifndef SHA256_H
#define SHA256_H

#include <stddef.h>

#define SHA256_DIGEST_LEN 32

void sha256(const void *data, size_t len, unsigned char digest[SHA256_DIGEST_LEN]);

#endif
