#!/usr/bin/env bash
# spark-submit one job with the code shipped as a --py-files archive, Delta's jars, and
# the project's venv as the Python of the driver and the executors.
#   scripts/submit.sh [spark-submit options...] JOB [job options...]
# e.g. scripts/submit.sh --master spark://host:7077 pipeline --env cluster --run-id nightly-2026-11-30
# Environment: SPARKDEEP_PYTHON (the executors' Python; default this .venv, which must exist
# at the same path on every worker, or see README "Running on a cluster" for --archives),
# SPARKDEEP_CONF_DIR (default: this repo's conf/).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
source "$ROOT/.venv/bin/activate"
opts=()
while [[ $# -gt 0 && $1 == -* ]]; do
  case $1 in
    --verbose|--supervise) opts+=("$1"); shift ;;
    *) opts+=("$1" "$2"); shift 2 ;;
  esac
done
[[ $# -ge 1 ]] || { echo "usage: $0 [spark-submit options] JOB [job options]" >&2; exit 2; }
job=$1; shift
[[ -f $ROOT/jobs/$job.py ]] || { echo "$0: no job named '$job' (see $ROOT/jobs)" >&2; exit 2; }
export SPARKDEEP_CONF_DIR=${SPARKDEEP_CONF_DIR:-$ROOT/conf}
pyfiles=$(bash "$ROOT/scripts/package.sh")
python=${SPARKDEEP_PYTHON:-$ROOT/.venv/bin/python}
# Spark's own log from the start: WARN, start-up chatter off (a --driver-java-options given
# in the options above replaces this one).
quiet=()
[[ -f $SPARKDEEP_CONF_DIR/log4j2.properties ]] && \
  quiet=(--driver-java-options "-Dlog4j2.configurationFile=file://$SPARKDEEP_CONF_DIR/log4j2.properties")
exec spark-submit "${quiet[@]}" --jars "$(python -m sparkdeep.jars classpath)" --py-files "$pyfiles" \
  --conf "spark.pyspark.python=$python" --conf "spark.pyspark.driver.python=$ROOT/.venv/bin/python" \
  --conf "spark.executorEnv.SPARKDEEP_CONF_DIR=$SPARKDEEP_CONF_DIR" \
  "${opts[@]}" "$ROOT/jobs/$job.py" "$@"
