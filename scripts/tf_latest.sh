#!/usr/bin/env bash
# TensorFlow beyond 2.18 (issue 24): a separate virtual environment with the newest
# TensorFlow and Keras the package index serves and no Horovod (whose last release builds
# only against TensorFlow <= 2.18), then the default pipeline trained there with
# train.strategy=collective (TensorFlow's own all-reduce).
#
#   bash scripts/tf_latest.sh [pipeline args...]     e.g. --env ci for the small sample
#
# VENV (default .venv-tf-latest) and OUT (default output/tf-latest) can be set.
# Prints the versions it ran with and the pipeline's held-out metrics.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv-tf-latest}
OUT=${OUT:-output/tf-latest}
PY=${PYTHON:-python3}

[[ -x $VENV/bin/python ]] || "$PY" -m venv "$VENV"
VPY=$VENV/bin/python
"$VPY" -m pip install --quiet --upgrade "pip==25.0.1" "setuptools==75.8.0" "wheel==0.45.1"

# The project's pins, except TensorFlow (the newest instead) and what follows it
# (numpy: the newest TensorFlow chooses). No lock file: TensorFlow's own dependencies move with it.
REQS=$(mktemp)
trap 'rm -f "$REQS"' EXIT
grep -v -i -E '^(tensorflow|tensorflow-cpu|keras|numpy|horovod)([=<>!~ ]|$)' requirements/runtime.txt > "$REQS"
echo "tf_latest: installing the newest tensorflow-cpu and keras with the project's other pins"
"$VPY" -m pip install --quiet --upgrade -r "$REQS" tensorflow-cpu keras
"$VPY" -m pip install --quiet --no-deps --no-build-isolation -e .
"$VPY" -m sparkdeep.jars fetch >/dev/null

if "$VPY" -c "import horovod" 2>/dev/null; then
  echo "tf_latest: Horovod is importable in $VENV; this environment must not have it" >&2
  exit 1
fi
"$VPY" - <<'EOF'
import importlib.metadata as m
print("tf_latest: " + ", ".join(f"{p} {m.version(p)}" for p in ("tensorflow-cpu", "keras", "numpy", "pyspark",
                                                                   "delta-spark")) + "; horovod not installed")
EOF

RUN_ID=tf-latest-$(date -u +%Y%m%dT%H%M%SZ)
start=$(date +%s)
"$VPY" -m sparkdeep.jobs.pipeline --run-id "$RUN_ID" --output-dir "$OUT" --set train.strategy=collective "$@"
echo "tf_latest: pipeline with train.strategy=collective done in $(( $(date +%s) - start )) s (output $OUT)"
"$VPY" - "$OUT" <<'EOF'
import json, os, sys
with open(os.path.join(sys.argv[1], "reports", "evaluate.json")) as fh:
    report = json.load(fh)
metrics = report.get("metrics") or {}
for name, m in metrics.items():
    shown = {k: round(v, 4) for k, v in m.items() if isinstance(v, float)}
    print(f"tf_latest: {name}: {shown}")
EOF
