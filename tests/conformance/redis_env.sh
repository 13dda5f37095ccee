#!/bin/sh
# Runs the conformance suite (argument 1) against the redis server named by TIER_REDIS_URL, which
# .ci/test starts and exports. Exits 77 (Meson: SKIP) when the variable is unset or the server does
# not answer; clears database 9 (the one tests/conformance/redis.json uses) before the run, since
# the suite expects to start from an empty tier. The eviction case is left out: a shared server's
# capacity is advisory (its own memory policy evicts), see backends/redis/README.md.
if [ -z "${TIER_REDIS_URL:-}" ]; then
  echo "TIER_REDIS_URL is not set (make test starts a redis-server and sets it): skipping" >&2
  exit 77
fi
if ! command -v redis-cli >/dev/null 2>&1 || \
   ! redis-cli -u "$TIER_REDIS_URL" -n 9 ping >/dev/null 2>&1; then
  echo "no redis server answers at $TIER_REDIS_URL: skipping" >&2
  exit 77
fi
redis-cli -u "$TIER_REDIS_URL" -n 9 flushdb >/dev/null || exit 1
exec "$@" --test-case-exclude='*old objects are evicted*'
