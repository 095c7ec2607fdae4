#!/usr/bin/env bash
# One scheduled run of the whole pipeline (what cron calls). The run id is the UTC date,
# so a second call the same day resumes the first instead of starting over.
#   SPARKDEEP_ENV (default cluster), SPARKDEEP_SUBMIT_ARGS (e.g. "--master yarn"),
#   SPARKDEEP_ARGS (extra job options), SPARKDEEP_RUN_ID (default daily-YYYY-MM-DD)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
mkdir -p "$ROOT/output/logs"
run_id=${SPARKDEEP_RUN_ID:-daily-$(date -u +%F)}
echo "[scheduled_run] $(date -u +%FT%TZ) run $run_id"
# shellcheck disable=SC2086 - the option strings are meant to split
exec "$ROOT/scripts/submit.sh" ${SPARKDEEP_SUBMIT_ARGS:-} pipeline --env "${SPARKDEEP_ENV:-cluster}" \
  --run-id "$run_id" --wait-lock 3600 ${SPARKDEEP_ARGS:-}
