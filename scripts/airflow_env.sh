#!/usr/bin/env bash
# A separate venv with Airflow (its pins clash with the project's), for checking the DAG
# with Airflow's own loader: .venv-airflow. Idempotent; prints the venv's python.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
AIRFLOW_VERSION=3.3.2
VENV=${AIRFLOW_VENV:-$ROOT/.venv-airflow}
PY=${PYTHON:-python3}
# One install at a time (each parallel test worker may start one): the others wait, then find it done.
exec 9>"$VENV.lock"
flock 9
if ! "$VENV/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('apache-airflow') != '$AIRFLOW_VERSION')" 2>/dev/null; then
  echo "airflow_env: installing apache-airflow $AIRFLOW_VERSION into $VENV (about 1-2 min)" >&2
  rm -rf "$VENV"
  "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet "apache-airflow==$AIRFLOW_VERSION" >&2
fi
echo "$VENV/bin/python"
