#!/usr/bin/env bash
# One idempotent set-up: .venv with pinned packages, Horovod built from source against
# TensorFlow with Gloo, the project installed, and Delta's jars cached locally.
# A second run with nothing changed only compares a stamp and exits.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VENV=$ROOT/.venv
PY=${PYTHON:-python3}
HOROVOD_VERSION=0.28.1
STAMP=$VENV/.setup-stamp

inputs_hash() {
  cat scripts/setup.sh requirements/*.txt pyproject.toml conf/base/spark.yaml 2>/dev/null | sha256sum | cut -d' ' -f1
}

# System packages: Debian's Chromium + ChromeDriver, for the test that opens the HTML
# report in a headless browser. Checked before the stamp: they live outside .venv.
if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
  if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    echo "setup: installing chromium and chromium-driver (Debian packages)"
    apt-get install -y -q chromium chromium-driver >/dev/null 2>&1 ||
      { apt-get update -q >/dev/null && apt-get install -y -q chromium chromium-driver >/dev/null; }
  else
    echo "setup: chromium/chromedriver missing; install Debian's chromium and chromium-driver (as root) for the report test" >&2
  fi
fi

if [[ -f $STAMP && "$(cat "$STAMP")" == "$(inputs_hash)" ]]; then
  # The jars live in $SPARKDEEP_CACHE (default ~/.cache/sparkdeep), outside .venv: another
  # cache folder than set-up's would make every step resolve them with Ivy (and print its
  # report), so an up-to-date .venv still fetches them into this one.
  if ! "$VENV/bin/python" -m sparkdeep.jars check 2>/dev/null; then
    echo "setup: fetching Delta jars into ${SPARKDEEP_CACHE:-~/.cache/sparkdeep}"
    "$VENV/bin/python" -m sparkdeep.jars fetch >/dev/null 2>"$VENV/.jars-fetch.log" ||
      { cat "$VENV/.jars-fetch.log" >&2; exit 1; }
  fi
  echo "setup: up to date ($VENV)"
  exit 0
fi

t0=$(date +%s)
[[ -x $VENV/bin/python ]] || "$PY" -m venv "$VENV"
VPY=$VENV/bin/python
"$VPY" -m pip install --quiet --upgrade "pip==25.0.1" "setuptools==75.8.0" "wheel==0.45.1"

LOCK=()
[[ -f requirements/lock.txt ]] && LOCK=(-c requirements/lock.txt)
echo "setup: installing pinned packages"
"$VPY" -m pip install --quiet "${LOCK[@]}" -r requirements/runtime.txt -r requirements/dev.txt

if ! "$VPY" -c "import horovod, importlib.metadata as m; assert m.version('horovod') == '$HOROVOD_VERSION'; import horovod.tensorflow" 2>/dev/null; then
  echo "setup: building horovod $HOROVOD_VERSION from source (about 10 min on 2 cores; pip caches the wheel)"
  TFI=$("$VPY" -c 'import tensorflow as tf; print(tf.sysconfig.get_include())' 2>/dev/null)
  # The TF wheel keeps these two headers outside its main include folder.
  export CPLUS_INCLUDE_PATH="$TFI/external/highwayhash:$TFI/external/farmhash_archive/src"
  export HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
         HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1
  # On a GPU machine also export HOROVOD_GPU_OPERATIONS=NCCL (see README).
  export MAKEFLAGS="-j$(nproc)"
  "$VPY" -m pip install --no-build-isolation --no-deps "horovod==$HOROVOD_VERSION"
fi

echo "setup: installing the project"
"$VPY" -m pip install --quiet --no-deps --no-build-isolation -e .

echo "setup: fetching Delta jars"
"$VPY" -m sparkdeep.jars fetch

"$VENV/bin/horovodrun" --check-build | sed -n '1,20p'
inputs_hash > "$STAMP"
echo "setup: done in $(( $(date +%s) - t0 )) s"
