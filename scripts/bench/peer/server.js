// make bench's peer: the sidecar a Node.js shop would write in an
// afternoon, on the libraries it would pick (rate-limiter-flexible's
// RateLimiterRedis, one Lua call per check, over ioredis), set up for
// speed: auto-pipelining on, and one process per core asked for. It
// answers nginx auth_request's /check as ratelimitd does, so the same wrk
// load runs against both in one bench run.
//
//   node server.js PORT REDIS_PORT PROCESSES
//
// Route fw only: 1,000,000 per hour keyed by X-Api-Key, as
// bench/policy.yaml.in's fw route. rate-limiter-flexible's window starts
// at a key's first hit where ours is aligned to the clock; under this load
// (no key near its limit) both cost one counter update in Redis.
//
// It fails open when Redis errs, with no retries and no offline queue, so
// that a dead Redis answers at once rather than after ioredis's 20 retries;
// it has no per-call deadline (ioredis's commandTimeout arms a timer per
// call, a cost ratelimitd's shared deadline does not have).
'use strict';
const cluster = require('node:cluster');
const http = require('node:http');
const Redis = require('ioredis');
const { RateLimiterRedis, RateLimiterRes } = require('rate-limiter-flexible');

const [port, redisPort, processes] = process.argv.slice(2).map(Number);
const LIMIT = 1000000;
const WINDOW_S = 3600;

if (!port || !redisPort || !processes) {
  console.error('usage: node server.js PORT REDIS_PORT PROCESSES');
  process.exit(2);
}

if (cluster.isPrimary && processes > 1) {
  for (let i = 0; i < processes; i++) cluster.fork();
  cluster.on('exit', (w, code) => {
    console.error(`peer: worker ${w.process.pid} exited (${code})`);
    process.exitCode = 1;
  });
  // The bench stops the primary by PID: take the workers with it, and
  // exit 1 if one of them had died, so that the bench can say so.
  process.on('SIGTERM', () => {
    cluster.removeAllListeners('exit');
    for (const id in cluster.workers) cluster.workers[id].kill('SIGTERM');
    process.exit(process.exitCode || 0);
  });
} else {
  serve();
}

function serve() {
  const redis = new Redis({
    host: '127.0.0.1', port: redisPort, enableAutoPipelining: true,
    maxRetriesPerRequest: 0, enableOfflineQueue: false,
  });
  redis.on('error', (e) => console.error(`peer: redis: ${e.message}`));
  const limiter = new RateLimiterRedis({
    storeClient: redis, keyPrefix: 'peer:fw', points: LIMIT, duration: WINDOW_S,
  });

  function headers(r) {
    return {
      'X-RateLimit-Limit': String(LIMIT),
      'X-RateLimit-Remaining': String(r.remainingPoints),
      'X-RateLimit-Reset': String(Math.ceil(r.msBeforeNext / 1000)),
    };
  }

  const server = http.createServer((req, res) => {
    if (req.url === '/readyz') {
      res.writeHead(redis.status === 'ready' ? 200 : 503).end();
      return;
    }
    const key = req.headers['x-api-key'];
    if (!key) {
      res.writeHead(400).end();
      return;
    }
    limiter.consume(key, 1).then(
      (r) => res.writeHead(200, headers(r)).end(),
      (r) => {
        if (r instanceof RateLimiterRes) {
          const h = headers(r);
          h['Retry-After'] = h['X-RateLimit-Reset'];
          res.writeHead(429, h).end();
        } else {
          res.writeHead(200).end();     // Redis failed: fail open
        }
      });
  });
  server.keepAliveTimeout = 60000;
  server.listen(port, '127.0.0.1');
  process.on('SIGTERM', () => process.exit(0));
}
