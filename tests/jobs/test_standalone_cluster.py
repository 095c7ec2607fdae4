"""A real Spark standalone cluster on 127.0.0.1 (master + 2 workers): the pipeline runs through
spark-submit with the code shipped as a --py-files archive, Horovod ranks on the executors."""
import glob
import json
import os
import subprocess

import pyspark
import pytest

from tests._standalone import StandaloneCluster
from tests.conftest import ci_java_options

pytestmark = pytest.mark.slow

CI = ["--set", "data.sample_fraction=0.03", "--set", "train.epochs=2", "--set", "train.batch_size=128",
      "--set", "baselines.models=[logistic_regression]"]  # one baseline: the cluster is what is tested


@pytest.fixture
def cluster(tmp_path):
    c = StandaloneCluster(os.path.dirname(pyspark.__file__), str(tmp_path / "cluster"), workers=2, cores=1,
                          memory="3g")
    try:
        yield c.start()
    finally:  # stopped even when the test (or the start) fails
        c.stop()
        assert all(p.poll() is not None for p in c.procs)


def test_pipeline_under_spark_submit_on_a_standalone_cluster(cluster, repo_root, tmp_path):
    out = tmp_path / "out"
    cmd = ["bash", os.path.join(repo_root, "scripts", "submit.sh"), "--master", cluster.url,
           "--conf", "spark.cores.max=2", "--conf", "spark.executor.memory=2g",
           # conf/ci's JIT tier for the driver and executors (submit.sh's log4j option kept).
           "--driver-java-options", f"{ci_java_options()} -Dlog4j2.configurationFile=file://{repo_root}/conf/log4j2.properties",
           "--conf", f"spark.executor.extraJavaOptions={ci_java_options()}",
           "pipeline", "--env", "cluster", "--output-dir", str(out), "--run-id", "on-cluster", *CI]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, cwd=str(tmp_path))
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-4000:])
    assert "run on-cluster succeeded" in done.stdout

    with open(out / "runs" / "on-cluster" / "manifest.json") as fh:
        m = json.load(fh)
    assert m["status"] == "succeeded"
    assert m["config"]["spark"]["settings"]["spark.executor.cores"] == "1"  # conf/cluster applied
    rows = m["steps"]["score"]["rows"]
    assert rows["rows_out_predictions"] == rows["rows_in"] == m["steps"]["prepare"]["rows"]["rows_holdout"] > 0
    assert 0.5 < m["metrics"]["keras_horovod"]["auc"] <= 1.0

    # The ranks ran on the executors, from the shipped archive, one per worker.
    with open(out / "reports" / "train.json") as fh:
        ranks = json.load(fh)["keras"]["ranks"]
    assert len(ranks) == 2
    assert all(r["code_path"].endswith(".zip") for r in ranks), [r["code_path"] for r in ranks]
    for i in range(2):
        shipped = glob.glob(os.path.join(cluster.work_dir, f"worker{i}", "app-*", "*", "sparkdeep-*.zip"))
        assert shipped, f"worker{i} never fetched the code archive"
    app = [a for a in cluster.state()["completedapps"] if a["name"] == "sparkdeep-pipeline"]
    assert app and app[0]["state"] == "FINISHED"
