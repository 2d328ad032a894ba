# ratelimitd container image.
#
#   docker build -t ratelimitd .
#   docker run --rm --network host -v "$PWD/conf:/etc/ratelimitd:ro" \
#       -e REDIS_PASSWORD ratelimitd
#
# --network host makes the policy's 127.0.0.1 addresses (listen, and a
# Redis on the host) the host's. The directory is mounted, not the file: a
# file mounted alone stays the inode it was at `docker run`, and an editor
# that saves by renaming leaves the container the old one.
#
# Two stages on Debian 12: the first builds with the project's own Makefile,
# the second carries only the binary and the shared libraries it links.
# The image is meant to run as a sidecar that shares the gateway's network
# namespace (a Kubernetes pod, or conf/compose.yaml), so the default
# `listen: 127.0.0.1:8080` is reachable by the gateway and nothing else.

# --- build -----------------------------------------------------------------
FROM debian:12-slim AS build

RUN apt-get update \
 && apt-get install -y --no-install-recommends \
        build-essential pkg-config \
        libevent-dev libhiredis-dev libjansson-dev libyaml-dev \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /src
COPY Makefile ./
COPY src ./src
COPY scripts ./scripts
# `make` builds build/ratelimitd, with the Lua scripts compiled in.
RUN make && ./build/ratelimitd -v

# --- runtime ---------------------------------------------------------------
FROM debian:12-slim

# Only the runtime halves of the -dev packages above (Debian 12 names;
# apt adds libevent-core-2.1-7, which libevent-pthreads needs).
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
        libevent-2.1-7 libevent-pthreads-2.1-7 \
        libhiredis0.14 libjansson4 libyaml-0-2 \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 ratelimitd \
 && useradd --system --uid 10001 --gid 10001 --no-create-home \
        --home-dir /nonexistent --shell /usr/sbin/nologin ratelimitd

COPY --from=build /src/build/ratelimitd /usr/local/bin/ratelimitd
# Fail the build now, not at first start, if a shared library is missing.
RUN ! ldd /usr/local/bin/ratelimitd | grep 'not found' \
 && /usr/local/bin/ratelimitd -v

# A default policy, so that the image starts without a mount. Its Redis,
# 127.0.0.1:6379, is the container's own loopback unless the container
# shares a network namespace with one: until then every check fails open.
# Mount your own directory over /etc/ratelimitd, read-only. The daemon re-reads the file when it
# changes, including the symlink swap of a Kubernetes ConfigMap, and on
# SIGHUP (`docker kill -s HUP`). The Redis password comes from the
# environment (REDIS_PASSWORD, or whatever redis.password_env names), never
# from this file.
COPY conf/ratelimitd.yaml /etc/ratelimitd/ratelimitd.yaml

# Numeric, so that Kubernetes' runAsNonRoot can check it.
USER 10001:10001

EXPOSE 8080

# Liveness: GET /healthz on the policy's listen address: 127.0.0.1, port
# RATELIMITD_HEALTH_PORT (8080, the default policy's, when unset; give
# `-e RATELIMITD_HEALTH_PORT=9090` with `listen: 127.0.0.1:9090`, or your
# own --health-cmd for a unix socket). The slim
# image has no curl or wget, and the daemon has no client mode. Rather than
# install curl and its libraries for one request, this uses bash's built-in
# /dev/tcp. It reads the whole reply (the daemon closes an HTTP/1.0
# connection after answering), so the daemon never writes to a closed socket.
# /healthz, not /readyz: while Redis is down the daemon still
# answers, failing open or closed as configured, and restarting it would not
# bring Redis back.
HEALTHCHECK --interval=10s --timeout=2s --start-period=5s --retries=3 \
    CMD ["bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/${RATELIMITD_HEALTH_PORT:-8080} && printf 'GET /healthz HTTP/1.0\\r\\nHost: localhost\\r\\n\\r\\n' >&3 && { IFS= read -r -d '' -t 2 reply <&3; [[ $reply == 'HTTP/1.'[01]' 200 '* ]]; }"]

# Foreground, logs to stderr. SIGTERM drains for up to server.drain_timeout
# (5s by default), which is inside `docker stop`'s 10 s grace period.
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/ratelimitd"]
CMD ["-c", "/etc/ratelimitd/ratelimitd.yaml"]
