#!/usr/bin/env bash
# spark-submit one job with the project's venv and Delta's cached jars.
#   scripts/submit.sh [spark-submit options...] JOB [job options...]
# e.g. scripts/submit.sh --master 'local[2]' evaluate --env ci
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
source "$ROOT/.venv/bin/activate"
opts=()
while [[ $# -gt 0 && $1 == -* ]]; do opts+=("$1" "$2"); shift 2; done
[[ $# -ge 1 ]] || { echo "usage: $0 [spark-submit options] JOB [job options]" >&2; exit 2; }
job=$1; shift
exec spark-submit --jars "$(python -m sparkdeep.jars classpath)" \
  --conf "spark.pyspark.python=$ROOT/.venv/bin/python" "${opts[@]}" "$ROOT/jobs/$job.py" "$@"
