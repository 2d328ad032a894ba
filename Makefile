# ratelimitd — plain Makefile (STYLE 23). `make` builds build/ratelimitd;
# `make test` runs every test; `make run` starts it with a local Redis;
# `make bench` measures it; `make soak` runs the sanitized daemon through
# Redis faults and reloads under load. SANITIZE=address,undefined builds a
# sanitized binary under build/asan/.

CC	?= cc
PKGS	 = libevent libevent_pthreads hiredis yaml-0.1 jansson
WARN	 = -Wall -Wextra -Werror -Wformat=2 -Wshadow -Wpointer-arith \
	   -Wcast-qual -Wwrite-strings -Wstrict-prototypes \
	   -Wmissing-prototypes -Wmissing-declarations
CFLAGS	?= -g -O2
# override: a CFLAGS given on the command line (make CFLAGS=-O0) replaces
# the -g -O2 above, not the language, warnings and sanitizer flags.
override CFLAGS	+= -std=c11 -D_POSIX_C_SOURCE=200809L $(WARN) \
	   $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
LDLIBS	 = $(shell pkg-config --libs $(PKGS) 2>/dev/null) -lpthread

ifdef SANITIZE
ifeq ($(SANITIZE),thread)
# ThreadSanitizer reports the epoll changelist's late DEL of a closed
# descriptor once another worker holds its number (see worker.c), and then
# trips over its own report; that build runs without the changelist.
BUILD	 = build/tsan
override CFLAGS	+= -DRATELIMITD_NO_EPOLL_CHANGELIST
else
BUILD	 = build/asan
endif
override CFLAGS	+= -fsanitize=$(SANITIZE) -fno-omit-frame-pointer -fno-sanitize-recover=all
override LDFLAGS += -fsanitize=$(SANITIZE)
else ifdef COVERAGE
# gcc's line counts, for `make coverage` (scripts/coverage.sh).
BUILD	 = build/cov
override CFLAGS	+= --coverage
override LDFLAGS += --coverage
else
BUILD	 = build
endif

# The limits script: prelude, one file per algorithm, entry point. Adding an
# algorithm is one .lua file here and one entry in config.c's table.
ALGORITHMS = fixed_window token_bucket sliding_window_log sliding_window_counter leaky_bucket gcra
LUA	 = scripts/lib.lua $(ALGORITHMS:%=scripts/%.lua) scripts/main.lua

SRCS	 = $(wildcard src/*.c)
LIBSRCS	 = $(filter-out src/main.c,$(SRCS))
OBJS	 = $(SRCS:src/%.c=$(BUILD)/obj/%.o) $(BUILD)/obj/script.o
LIBOBJS	 = $(LIBSRCS:src/%.c=$(BUILD)/obj/%.o) $(BUILD)/obj/script.o
UNITSRCS = $(wildcard tests/unit/*.c)

PYTHON	 = /usr/bin/python3
DEBS_BUILD = build-essential pkg-config libevent-dev libhiredis-dev libjansson-dev libyaml-dev
DEBS_RUN   = redis-server redis-tools
# libclang-rt-dev: the ASan/UBSan and fuzzer runtimes of the default clang,
# which its libclang-common only recommends (--no-install-recommends leaves
# them out).
DEBS_TEST  = python3-pytest python3-redis python3-requests nginx-light clang \
	     libclang-rt-dev wrk strace stunnel4 openssl curl

.PHONY: all clean test unit integration asan tsan run bench soak coverage deps deps-test fuzz \
	install uninstall

all: $(BUILD)/ratelimitd build/limits.lua

$(BUILD)/ratelimitd: $(OBJS)
	@echo "  LD    $@"
	@$(CC) $(LDFLAGS) -o $@ $(OBJS) $(LDLIBS)

$(BUILD)/obj/%.o: src/%.c $(wildcard src/*.h) | $(BUILD)/obj
	@echo "  CC    $<"
	@$(CC) $(CFLAGS) -Isrc -c -o $@ $<

build/limits.lua: $(LUA) | build
	cat $(LUA) > $@

# The script is embedded as a C string so the binary is self-contained.
$(BUILD)/obj/script.c: build/limits.lua | $(BUILD)/obj
	{ echo '/* generated from the scripts directory by the Makefile */'; \
	  echo '#include "script.h"'; \
	  echo 'const char script_source[] ='; \
	  sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e 's/^/"/' -e 's/$$/\\n"/' $<; \
	  echo ';'; } > $@

$(BUILD)/obj/script.o: $(BUILD)/obj/script.c src/script.h
	@echo "  CC    $<"
	@$(CC) $(CFLAGS) -Isrc -c -o $@ $<

$(BUILD)/obj build:
	mkdir -p $@

$(BUILD)/unit: $(UNITSRCS) $(LIBOBJS)
	$(CC) $(CFLAGS) $(LDFLAGS) -Isrc -o $@ $(UNITSRCS) $(LIBOBJS) $(LDLIBS)

unit: $(BUILD)/unit
	$(BUILD)/unit

integration: all
	$(PYTHON) -m pytest -q tests/integration

# The unit tests, then the integration suite, against the sanitized build
# (leaks make the daemon exit non-zero, which the harness fails on; the
# unit tests drive pure code at values no policy reaches, where UBSan has
# found an overflowing cast a policy could not). The script-model suites talk
# to Redis only, test_allocations preloads its counter into the release
# binary (ASan brings its own allocator), and test_syscalls counts the
# release binary's system calls, and test_prometheus tests the alerting
# rules rather than the daemon, so they are not repeated here; nor is
# test_algorithms_daemon, whose 40 s are mostly waits for real time to
# refill a limit, over the check path every other suite takes (it kept a
# fresh-clone CI run near its 15 minutes); and two tests that only wait on
# timers (the reload's 10 s bound, the reconnect jitter).
asan:
	$(MAKE) SANITIZE=address,undefined CC=clang build/asan/ratelimitd build/asan/unit
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 \
	UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 build/asan/unit
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 \
	UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	RATELIMITD_BIN=$(CURDIR)/build/asan/ratelimitd \
	    $(PYTHON) -m pytest -q -p no:cacheprovider tests/integration \
	    --ignore=tests/integration/test_scripts_model.py \
	    --ignore=tests/integration/test_script_boundaries.py \
	    --ignore=tests/integration/test_script_batches.py \
	    --ignore=tests/integration/test_allocations.py \
	    --ignore=tests/integration/test_syscalls.py \
	    --ignore=tests/integration/test_prometheus.py \
	    --ignore=tests/integration/test_algorithms_daemon.py \
	    --deselect tests/integration/test_reload.py::test_a_file_that_never_holds_still_is_loaded_after_10_s \
	    --deselect tests/integration/test_redis_faults.py::test_reconnects_are_spread_not_in_step

# The suites that run several workers, reloads and Redis faults, against a
# ThreadSanitizer build: the workers share nothing mutable but the policy
# and the metrics. Not in `make test` (four more minutes of CI). The
# start-up signal tests are left out: the TSan runtime takes longer to
# start than the 50 ms those tests allow before their signal.
TSAN_SUITES = concurrency reload deny_cache fleet_exactness drain metrics \
	      serving http_robustness redis_faults logs
tsan:
	$(MAKE) SANITIZE=thread CC=clang build/tsan/ratelimitd
	TSAN_OPTIONS=halt_on_error=1:abort_on_error=0 \
	RATELIMITD_BIN=$(CURDIR)/build/tsan/ratelimitd \
	    $(PYTHON) -m pytest -q -p no:cacheprovider \
	    $(TSAN_SUITES:%=tests/integration/test_%.py) -k 'not during_startup'

# Installs the build and test packages when one is missing (Debian).
deps:
	@sh scripts/deps.sh $(DEBS_BUILD) $(DEBS_RUN)
deps-test:
	@sh scripts/deps.sh $(DEBS_BUILD) $(DEBS_RUN) $(DEBS_TEST)

# Builds two at a time (the machine's cores): about 20 s of a CI run
# that has 15 minutes.
test: deps-test
	$(MAKE) -j2 all
	$(MAKE) unit
	sh scripts/fetch-prometheus.sh	# for the alerting-rule tests
	$(MAKE) integration
	$(MAKE) -j2 asan
	$(MAKE) -j2 fuzz FUZZ_SECONDS=10	# each of the four targets: CI stays within 15 minutes

# POLICY=conf/nginx-policy.yaml for the nginx recipe (deny_status 403)
POLICY ?= conf/ratelimitd.yaml
run: deps
	$(MAKE) all
	sh scripts/run.sh $(POLICY)

bench: deps-test
	bash scripts/bench.sh

# Lines of src/ run by the unit tests and the integration suite, per file
# (gcov); not part of `make test`.
coverage: deps-test
	sh scripts/coverage.sh

# The sanitized daemon under wrk load through SOAK_SECONDS (default 60) of
# Redis faults and reloads; not part of `make test` (see README).
soak: deps-test
	bash scripts/soak.sh

# Fuzzes the policy loader (config.c and what it uses), the HTTP server,
# the request path of one worker (every module but main.c, with Redis
# down) and the verdict modules (limiter.c, denycache.c) with libFuzzer,
# ASan and UBSan, for FUZZ_SECONDS (default 60) each. The code under test
# is compiled with the target, so that libFuzzer's coverage instrumentation
# reaches it (objects built without it would leave the fuzzer blind to
# every branch but the harness's own). fuzz_check's dictionary lets a
# mutation write a whole token (a header, a percent-escape) over a
# request's bytes, which keeps a body's Content-Length right, where
# inserted bytes would make it wrong.
FUZZ_SECONDS ?= 60
FUZZ_CFLAGS = $(CFLAGS) -fsanitize=fuzzer,address,undefined \
	      -fno-sanitize-recover=all -fno-omit-frame-pointer -Isrc
POLICY_FUZZ_SRCS = tests/fuzz/fuzz_policy.c src/config.c src/config_json.c src/duration.c \
		   src/yamldoc.c src/rxcheck.c src/policy.c src/log.c src/sha256.c src/xmalloc.c
HTTP_FUZZ_SRCS = tests/fuzz/fuzz_http.c tests/fuzz/loopback.c src/server.c src/chunked.c \
		 src/log.c \
		 src/xmalloc.c
# The whole daemon but main.c, as one worker of it runs.
CHECK_FUZZ_SRCS = tests/fuzz/fuzz_check.c tests/fuzz/loopback.c $(LIBSRCS) \
		  $(BUILD)/obj/script.c
VERDICT_FUZZ_SRCS = tests/fuzz/fuzz_verdict.c src/limiter.c src/denycache.c src/siphash.c \
		    src/config.c src/duration.c src/yamldoc.c src/rxcheck.c src/policy.c \
		    src/sha256.c src/log.c src/xmalloc.c

build/fuzz_policy: $(POLICY_FUZZ_SRCS) $(wildcard src/*.h tests/fuzz/*.h) | build
	clang $(FUZZ_CFLAGS) -o $@ $(POLICY_FUZZ_SRCS) $(LDLIBS)

build/fuzz_http: $(HTTP_FUZZ_SRCS) $(wildcard src/*.h tests/fuzz/*.h) | build
	clang $(FUZZ_CFLAGS) -o $@ $(HTTP_FUZZ_SRCS) $(LDLIBS)

build/fuzz_check: $(CHECK_FUZZ_SRCS) $(wildcard src/*.h tests/fuzz/*.h) | build
	clang $(FUZZ_CFLAGS) -o $@ $(CHECK_FUZZ_SRCS) $(LDLIBS)

build/fuzz_verdict: $(VERDICT_FUZZ_SRCS) $(wildcard src/*.h tests/fuzz/*.h) | build
	clang $(FUZZ_CFLAGS) -o $@ $(VERDICT_FUZZ_SRCS) $(LDLIBS)

fuzz: build/fuzz_policy build/fuzz_http build/fuzz_check build/fuzz_verdict
	mkdir -p build/fuzz-corpus build/fuzz-http-corpus build/fuzz-check-corpus \
	    build/fuzz-verdict-corpus
	build/fuzz_policy -max_total_time=$(FUZZ_SECONDS) -max_len=4096 \
	    build/fuzz-corpus tests/fuzz/corpus
	build/fuzz_http -max_total_time=$(FUZZ_SECONDS) -max_len=4096 \
	    build/fuzz-http-corpus tests/fuzz/http-corpus
	build/fuzz_check -max_total_time=$(FUZZ_SECONDS) -max_len=4096 \
	    -dict=tests/fuzz/check.dict build/fuzz-check-corpus tests/fuzz/check-corpus
	build/fuzz_verdict -max_total_time=$(FUZZ_SECONDS) -max_len=4096 \
	    build/fuzz-verdict-corpus tests/fuzz/verdict-corpus

# `sudo make install` puts the binary, the systemd unit and (only where
# none is yet) the example policy where the unit looks for them; the unit
# is rewritten to the directories given, so PREFIX=/opt/ratelimitd works.
# DESTDIR stages it all under a directory, as packagers do. It builds with
# what `make` uses and installs no packages.
PREFIX	?= /usr/local
BINDIR	?= $(PREFIX)/bin
SYSCONFDIR ?= /etc
UNITDIR	?= /etc/systemd/system
CONFDIR	 = $(SYSCONFDIR)/ratelimitd
install: all
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(CONFDIR) $(DESTDIR)$(UNITDIR)
	install -m 0755 build/ratelimitd $(DESTDIR)$(BINDIR)/ratelimitd
	@# a policy already there is the operator's own: never replaced
	@if [ -e $(DESTDIR)$(CONFDIR)/ratelimitd.yaml ]; then \
	    echo "$(DESTDIR)$(CONFDIR)/ratelimitd.yaml: kept as it is"; \
	else \
	    echo "install -m 0644 conf/ratelimitd.yaml $(DESTDIR)$(CONFDIR)/ratelimitd.yaml"; \
	    install -m 0644 conf/ratelimitd.yaml $(DESTDIR)$(CONFDIR)/ratelimitd.yaml; \
	fi
	sed -e 's|/usr/local/bin/ratelimitd|$(BINDIR)/ratelimitd|g' \
	    -e 's|/etc/ratelimitd/|$(CONFDIR)/|g' \
	    -e 's|/etc/default/ratelimitd|$(SYSCONFDIR)/default/ratelimitd|g' \
	    systemd/ratelimitd.service > $(DESTDIR)$(UNITDIR)/ratelimitd.service.tmp
	chmod 0644 $(DESTDIR)$(UNITDIR)/ratelimitd.service.tmp
	mv -f $(DESTDIR)$(UNITDIR)/ratelimitd.service.tmp $(DESTDIR)$(UNITDIR)/ratelimitd.service
	@echo "then: systemctl daemon-reload && systemctl enable --now ratelimitd"

# The policy stays: it is the operator's.
uninstall:
	@test -n "$(BINDIR)" && test -n "$(UNITDIR)" || \
	    { echo "uninstall: BINDIR and UNITDIR must not be empty"; exit 1; }
	rm -f $(DESTDIR)$(BINDIR)/ratelimitd $(DESTDIR)$(UNITDIR)/ratelimitd.service

clean:
	rm -rf build
