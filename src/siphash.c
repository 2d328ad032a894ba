/*
 * SipHash-2-4. Without a secret key, a client who knows another's key
 * could search for one of its own that hashes alike; with one drawn at
 * startup it cannot, since the key is what SipHash keeps from it.
 */
#include "siphash.h"

#define ROTL(x, b)	(uint64_t)(((x) << (b)) | ((x) >> (64 - (b))))

static void
sip_round(uint64_t v[4])
{
	v[0] += v[1];
	v[1] = ROTL(v[1], 13);
	v[1] ^= v[0];
	v[0] = ROTL(v[0], 32);
	v[2] += v[3];
	v[3] = ROTL(v[3], 16);
	v[3] ^= v[2];
	v[0] += v[3];
	v[3] = ROTL(v[3], 21);
	v[3] ^= v[0];
	v[2] += v[1];
	v[1] = ROTL(v[1], 17);
	v[1] ^= v[2];
	v[2] = ROTL(v[2], 32);
}

/* Eight bytes as a little-endian word, on any host. */
static uint64_t
le64(const unsigned char *p, size_t n)
{
	uint64_t w = 0;

	for (size_t i = 0; i < n; i++)
		w |= (uint64_t)p[i] << (8 * i);
	return w;
}

static void
sip_absorb(uint64_t v[4], uint64_t m)
{
	v[3] ^= m;
	sip_round(v);
	sip_round(v);
	v[0] ^= m;
}

uint64_t
siphash24(const uint64_t key[2], const void *data, size_t len)
{
	const unsigned char *p = data;
	uint64_t v[4] = {
		0x736f6d6570736575ULL ^ key[0], 0x646f72616e646f6dULL ^ key[1],
		0x6c7967656e657261ULL ^ key[0], 0x7465646279746573ULL ^ key[1],
	};
	size_t whole = len - len % 8;

	for (size_t i = 0; i < whole; i += 8)
		sip_absorb(v, le64(p + i, 8));
	/* The last word: the bytes left, and the length's low byte on top. */
	sip_absorb(v, le64(p + whole, len % 8) | (uint64_t)(len & 0xff) << 56);
	v[2] ^= 0xff;
	for (int i = 0; i < 4; i++)
		sip_round(v);
	return v[0] ^ v[1] ^ v[2] ^ v[3];
}
