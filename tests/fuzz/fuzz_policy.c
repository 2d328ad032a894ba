/*
 * libFuzzer target for the policy loader: any bytes as a policy file must
 * give a policy or FILE:LINE:COL errors, never a crash, a leak or undefined
 * behaviour. Built and run by `make fuzz` (clang, ASan + UBSan).
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "config_json.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static char path[64];
	struct config_errors errors;
	struct config *c;
	FILE *fp;

	if (path[0] == '\0')
		snprintf(path, sizeof(path), "/tmp/ratelimitd-fuzz-%d.yaml", (int)getpid());
	if ((fp = fopen(path, "w")) == NULL)
		return 0;
	fwrite(data, 1, size, fp);
	fclose(fp);
	c = config_load(path, &errors);
	if (c == NULL) {
		/* every error names the place */
		for (size_t i = 0; i < errors.n; i++)
			if (strncmp(errors.lines[i], path, strlen(path)) != 0 ||
			    errors.lines[i][strlen(path)] != ':')
				abort();
		if (errors.n == 0)
			abort();
	} else {
		json_t *j = config_to_json(c);

		json_decref(j);
		config_unref(c);
	}
	config_errors_free(&errors);
	return 0;
}
