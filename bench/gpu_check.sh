#!/usr/bin/env bash
# GPU readiness check for a machine with NVIDIA GPUs (never part of CI).
#
# 1. Builds Horovod with NCCL against the CUDA build of TensorFlow 2.18.1 in a separate
#    venv (.venv-gpu), so the CPU set-up stays untouched.
# 2. Runs a 2-rank KerasHorovodEstimator fit on local[2] with one GPU per Spark task
#    (spark.task.resource.gpu.amount=1), and checks that each rank saw only its task's
#    GPU and that Horovod reports NCCL.
# Prints "GPU CHECK PASSED" or exits non-zero. About 15 minutes with the build.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v nvidia-smi >/dev/null || { echo "no nvidia-smi: this check needs a GPU machine"; exit 2; }
nvidia-smi -L
VENV=.venv-gpu
[[ -x $VENV/bin/python ]] || python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip==25.0.1 setuptools==75.8.0 wheel==0.45.1
grep -v '^tensorflow-cpu' requirements/runtime.txt > /tmp/gpu-runtime.txt
"$VENV/bin/python" -m pip install -q -c requirements/lock.txt -r /tmp/gpu-runtime.txt "tensorflow[and-cuda]==2.18.1" \
  -r requirements/dev.txt 2>&1 | tail -2 || "$VENV/bin/python" -m pip install -q -r /tmp/gpu-runtime.txt "tensorflow[and-cuda]==2.18.1"
if ! "$VENV/bin/horovodrun" --check-build 2>/dev/null | grep -q "\[X\] NCCL"; then
  TFI=$("$VENV/bin/python" -c 'import tensorflow as tf; print(tf.sysconfig.get_include())' 2>/dev/null)
  export CPLUS_INCLUDE_PATH="$TFI/external/highwayhash:$TFI/external/farmhash_archive/src"
  export HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_WITHOUT_PYTORCH=1 \
         HOROVOD_WITHOUT_MXNET=1 HOROVOD_GPU_OPERATIONS=NCCL MAKEFLAGS="-j$(nproc)"
  "$VENV/bin/python" -m pip install --no-build-isolation --no-deps --no-cache-dir horovod==0.28.1
fi
"$VENV/bin/horovodrun" --check-build | tee /tmp/hvd-build.txt
grep -q "\[X\] NCCL" /tmp/hvd-build.txt || { echo "Horovod was not built with NCCL"; exit 1; }
"$VENV/bin/python" -m pip install -q --no-deps --no-build-isolation -e .
"$VENV/bin/python" -m sparkdeep.jars fetch >/dev/null

DISCOVERY=$(mktemp)
cat > "$DISCOVERY" <<'SH'
#!/usr/bin/env bash
ids=$(nvidia-smi --query-gpu=index --format=csv,noheader | paste -sd, | sed 's/,/","/g')
echo "{\"name\": \"gpu\", \"addresses\": [\"$ids\"]}"
SH
chmod +x "$DISCOVERY"
"$VENV/bin/python" - "$DISCOVERY" <<'PY'
import sys
import numpy as np
from pyspark.ml.linalg import Vectors
from sparkdeep.config import SparkConfig
from sparkdeep.session import builder
from sparkdeep.transformers.keras_estimator import KerasHorovodEstimator

n_gpus = len(__import__("subprocess").check_output(["nvidia-smi", "-L"]).decode().strip().splitlines())
procs = min(2, n_gpus)
spark = builder(SparkConfig(master=f"local[{procs}]", settings={
    "spark.driver.resource.gpu.amount": str(procs),
    "spark.driver.resource.gpu.discoveryScript": sys.argv[1],
    "spark.task.resource.gpu.amount": "1", "spark.ui.enabled": "false"}), app_name="gpu-check").getOrCreate()
rng = np.random.default_rng(0)
x = rng.normal(size=(20000, 16))
y = (x[:, 0] > 0).astype(float)
df = spark.createDataFrame([(Vectors.dense(r), float(t)) for r, t in zip(x, y)], ["features", "label"])
model = KerasHorovodEstimator(numProc=procs, epochs=2, batchSize=256).fit(df)
devices = [r["devices"] for r in model.trainingSummary["ranks"]]
print("devices per rank:", devices)
assert all(devices), "a rank did not get its task's GPU"
assert len(set(devices)) == procs, "two ranks share a GPU"
assert len({r["weights_digest"] for r in model.trainingSummary["ranks"]}) == 1
print("GPU CHECK PASSED")
PY
