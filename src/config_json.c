/*
 * GET /v1/policy's body: the policy in force as JSON, as a user would
 * write it back (durations in their unit, "auto" workers as the threads
 * they became), with secrets left out.
 */
#include <arpa/inet.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config_json.h"
#include "duration.h"
#include "sha256.h"
#include "xmalloc.h"

/* As a user writes it (duration_format): /v1/policy reads like the file. */
static json_t *
duration_json(long long us)
{
	char buf[DURATION_TEXT_SIZE];

	duration_format(us, buf, sizeof(buf));
	return json_string(buf);
}

static json_t *
limits_json(const struct limit_set *set)
{
	json_t *arr = json_array();

	for (size_t i = 0; i < set->nlimits; i++) {
		const struct limit *l = &set->limits[i];
		json_t *o = json_object();

		json_object_set_new(o, "name", json_string(l->name));
		json_object_set_new(o, "algorithm", json_string(config_algorithm_name(l->algorithm)));
		if (config_algorithm_is_bucket(l->algorithm)) {
			char per[DURATION_TEXT_SIZE], rate[64];

			duration_format(l->rate_period_us, per, sizeof(per));
			/* "10/s", as SPEC writes it, rather than "10/1s" */
			snprintf(rate, sizeof(rate), "%lld/%s", l->rate_n,
			    per[0] == '1' && !isdigit((unsigned char)per[1]) ?
			    per + 1 : per);
			json_object_set_new(o, "burst", json_integer(l->quota));
			json_object_set_new(o, "rate", json_string(rate));
			if (l->algorithm == ALGORITHM_LEAKY_BUCKET)
				json_object_set_new(o, "delay", json_boolean(l->delay));
		} else {
			json_object_set_new(o, "limit", json_integer(l->quota));
			json_object_set_new(o, "window", duration_json(l->window_us));
			if (l->algorithm == ALGORITHM_SLIDING_WINDOW_COUNTER)
				json_object_set_new(o, "precision",
				    duration_json(l->precision_us));
		}
		json_array_append_new(arr, o);
	}
	return arr;
}

static json_t *
key_source_json(const struct key_source *k)
{
	static const char *const prefixes[] = { "ip", "header:", "query:", "cookie:", "global" };
	/* A name has no length limit: a fixed buffer cut long ones, and
	 * json_string refused one cut inside a UTF-8 character, dropping it. */
	char *text = xasprintf("%s%s", prefixes[k->type], k->name ? k->name : "");
	json_t *j = json_string(text);

	free(text);
	return j;
}

/*
 * An override key stands for itself in /v1/policy only as its SHA-256's
 * first 64 bits, "sha256:" and 16 hex digits: a key that exempts a client
 * or gives it a bigger quota is a secret, which anything on the loopback
 * (every container of a pod) could otherwise read and send. The operator
 * can still tell which key is in force: printf %s KEY | sha256sum.
 */
static json_t *
key_fingerprint(const char *key)
{
	static const char hex[] = "0123456789abcdef";
	unsigned char digest[SHA256_DIGEST_LEN];
	char out[sizeof("sha256:") + 16] = "sha256:";

	sha256(key, strlen(key), digest);
	for (size_t i = 0; i < 8; i++) {
		out[7 + 2 * i] = hex[digest[i] >> 4];
		out[8 + 2 * i] = hex[digest[i] & 15];
	}
	out[sizeof(out) - 1] = '\0';
	return json_string(out);
}

json_t *
config_to_json(const struct config *c)
{
	static const char *const path_kinds[] = { NULL, "path", "prefix", "regex" };
	static const char *const levels[] = { "error", "warn", "info", "debug" };
	json_t *root = json_object(), *server = json_object(), *redis = json_object();
	json_t *proxies = json_array(), *routes = json_array(), *log = json_object();
	char buf[300];

	json_object_set_new(server, "listen", json_string(c->listen));
	/* What is in force: "auto" is shown as the threads it became. */
	json_object_set_new(server, "workers", json_integer(c->workers_running ?
	    c->workers_running : c->workers));
	if (c->workers == 0)
		json_object_set_new(server, "workers_auto", json_true());
	json_object_set_new(server, "deny_status", json_integer(c->deny_status));
	json_object_set_new(server, "ietf_headers", json_boolean(c->ietf_headers));
	json_object_set_new(server, "idle_timeout", duration_json(c->idle_timeout_us));
	json_object_set_new(server, "drain_timeout", duration_json(c->drain_timeout_us));
	json_object_set_new(server, "max_connections", json_integer(c->max_connections));
	json_object_set_new(root, "server", server);

	json_object_set_new(redis, "address", json_string(c->redis_address));
	json_object_set_new(redis, "database", json_integer(c->redis_database));
	json_object_set_new(redis, "username", c->redis_username ?
	    json_string(c->redis_username) : json_null());
	json_object_set_new(redis, "password_env", c->redis_password_env ?
	    json_string(c->redis_password_env) : json_null());
	json_object_set_new(redis, "password_set", json_boolean(c->redis_password != NULL));
	json_object_set_new(redis, "timeout", duration_json(c->redis_timeout_us));
	json_object_set_new(redis, "connect_timeout",
	    duration_json(c->redis_connect_timeout_us));
	json_object_set_new(redis, "max_batch", json_integer(c->redis_max_batch));
	json_object_set_new(redis, "key_prefix", json_string(c->key_prefix));
	json_object_set_new(root, "redis", redis);

	json_object_set_new(root, "failure_mode", json_string(
	    c->failure_mode == FAILURE_MODE_CLOSED ? "closed" : "open"));
	for (size_t i = 0; i < c->ntrusted_proxies; i++) {
		const struct cidr *p = &c->trusted_proxies[i];
		char addr[INET6_ADDRSTRLEN];

		inet_ntop(p->family, p->addr, addr, sizeof(addr));
		snprintf(buf, sizeof(buf), "%s/%d", addr, p->bits);
		json_array_append_new(proxies, json_string(buf));
	}
	json_object_set_new(root, "trusted_proxies", proxies);
	json_object_set_new(root, "client_ipv6_prefix",
	    json_integer(c->client_ipv6_prefix));
	json_object_set_new(log, "level", json_string(levels[c->log_level]));
	json_object_set_new(log, "format", json_string(c->log_format ? "json" : "text"));
	json_object_set_new(log, "access", json_boolean(c->log_access));
	json_object_set_new(root, "log", log);

	for (size_t i = 0; i < c->nroutes; i++) {
		const struct route *r = &c->routes[i];
		json_t *o = json_object(), *match = json_object(), *keys = json_array();

		json_object_set_new(o, "name", json_string(r->name));
		if (r->path_kind != PATH_ANY)
			json_object_set_new(match, path_kinds[r->path_kind],
			    json_string(r->path));
		if (r->nmethods) {
			json_t *m = json_array();

			for (size_t j = 0; j < r->nmethods; j++)
				json_array_append_new(m, json_string(r->methods[j]));
			json_object_set_new(match, "methods", m);
		}
		if (r->host)
			json_object_set_new(match, "host", json_string(r->host));
		json_object_set_new(o, "match", match);
		for (size_t j = 0; j < r->nkeys; j++)
			json_array_append_new(keys, key_source_json(&r->keys[j]));
		json_object_set_new(o, "key", keys);
		json_object_set_new(o, "missing_key", json_string(
		    r->missing_key_allow ? "allow" : "deny"));
		json_object_set_new(o, "deny_status",
		    json_integer(config_route_deny_status(c, r)));
		json_object_set_new(o, "failure_mode", json_string(
		    config_route_failure_mode(c, r) == FAILURE_MODE_CLOSED ?
		    "closed" : "open"));
		json_object_set_new(o, "shadow", json_boolean(r->shadow));
		json_object_set_new(o, "limits", limits_json(&r->limits));
		if (r->noverrides) {
			json_t *ovs = json_array();

			for (size_t j = 0; j < r->noverrides; j++) {
				const struct override *ov = &r->overrides[j];
				json_t *oo = json_object(), *ks = json_array();

				for (size_t k = 0; k < ov->nkeys; k++)
					json_array_append_new(ks, key_fingerprint(ov->keys[k]));
				json_object_set_new(oo, "keys", ks);
				if (ov->set.unlimited)
					json_object_set_new(oo, "unlimited", json_true());
				else
					json_object_set_new(oo, "limits", limits_json(&ov->set));
				json_array_append_new(ovs, oo);
			}
			json_object_set_new(o, "overrides", ovs);
		}
		json_array_append_new(routes, o);
	}
	json_object_set_new(root, "routes", routes);
	return root;
}

void
config_render_json(struct config *c)
{
	json_t *o = config_to_json(c);

	free(c->json);
	c->json = json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII);
	c->json_len = c->json ? strlen(c->json) : 0;
	json_decref(o);
}
