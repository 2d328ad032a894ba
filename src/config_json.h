/*
 * The policy in force as JSON (GET /v1/policy), secrets omitted.
 */
#ifndef CONFIG_JSON_H
#define CONFIG_JSON_H

#include <jansson.h>

#include "config.h"

json_t *config_to_json(const struct config *config);
/* Sets config->json from config_to_json, once the policy is final. */
void config_render_json(struct config *config);

#endif
