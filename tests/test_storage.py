"""sparkdeep.storage on local paths and on a real HDFS (Hadoop's MiniDFSCluster on
127.0.0.1, issue 14 part 2): paths keep their scheme, small writes are atomic, the output
lock excludes a second holder and names the first."""
import json
import os
import threading

import pytest

from sparkdeep import storage
from sparkdeep.storage import LockHeldError, Storage


def test_paths_keep_their_scheme_and_local_ones_become_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert storage.qualify("out") == str(tmp_path / "out")
    assert storage.qualify("file:///data/out") == "/data/out"
    assert storage.qualify("hdfs://nn:8020/out/") == "hdfs://nn:8020/out"
    assert storage.join("s3a://bucket/out", "runs", "r1/") == "s3a://bucket/out/runs/r1"
    assert storage.join("/data/out", "runs") == "/data/out/runs"
    assert [storage.is_local(p) for p in ("/x", "file:/x", "hdfs://n/x", "s3a://b/x")] == [True, True, False, False]


def _exercise(st: Storage, root: str) -> None:
    """The same checks wherever ``root`` lives."""
    manifest = storage.join(root, "runs", "r1", "manifest.json")
    st.write_json(manifest, {"status": "running", "n": 1})
    st.write_json(manifest, {"status": "succeeded", "n": 2})  # replaced whole
    assert st.read_json(manifest) == {"status": "succeeded", "n": 2}
    assert st.listdir(storage.join(root, "runs", "r1")) == ["manifest.json"]  # no temp file left
    assert st.exists(manifest) and not st.is_dir(manifest) and st.is_dir(storage.join(root, "runs"))
    st.write_bytes(storage.join(root, "model.bin"), bytes(range(256)) * 100)
    assert st.read_bytes(storage.join(root, "model.bin")) == bytes(range(256)) * 100
    with pytest.raises(FileNotFoundError):
        st.read_bytes(storage.join(root, "nothing"))
    lock = storage.join(root, "locks", "output.lock")
    with st.lock(lock, owner="run r1"):
        with pytest.raises(LockHeldError, match="held by .*run r1"):
            with st.lock(lock, owner="run r2"):
                pass
    with st.lock(lock, owner="run r2"):  # released: free again
        pass
    st.delete(storage.join(root, "runs"))
    assert not st.exists(manifest)
    st.delete(storage.join(root, "runs"))  # nothing there is fine


def test_storage_on_local_paths(tmp_path):
    _exercise(Storage(), str(tmp_path / "out"))


def test_a_local_lock_excludes_another_process(tmp_path):
    import subprocess
    import sys
    lock = str(tmp_path / "output.lock")
    st = Storage()
    with st.lock(lock, owner="scheduler a"):
        code = ("import sys; from sparkdeep.storage import Storage, LockHeldError\n"
                "try:\n    Storage().lock(sys.argv[1], owner='b').__enter__()\n"
                "except LockHeldError as e:\n    print(e); sys.exit(3)\n")
        done = subprocess.run([sys.executable, "-c", code, lock], capture_output=True, text=True)
        assert done.returncode == 3 and "scheduler a" in done.stdout


@pytest.fixture(scope="module")
def hdfs(repo_root, tmp_path_factory, spark):
    from tests._hdfs import MiniHDFS
    cluster = MiniHDFS(repo_root, str(tmp_path_factory.mktemp("hdfs")))
    try:
        cluster.start()
        spark.sparkContext._jsc.hadoopConfiguration().set("dfs.replication", "1")
        yield cluster
    finally:  # stopped even when a test (or the start) fails
        cluster.stop()
        assert cluster.proc is None or cluster.proc.poll() is not None


@pytest.mark.slow
def test_storage_on_a_real_hdfs(hdfs, spark):
    _exercise(Storage(spark), f"{hdfs.url}/out")


@pytest.mark.slow
def test_the_hdfs_lock_is_create_if_absent_and_a_stale_one_can_be_broken(hdfs, spark):
    st = Storage(spark)
    lock = f"{hdfs.url}/locks/stale.lock"
    st.write_bytes(lock, json.dumps({"owner": "killed run"}).encode())  # left by a killed holder
    with pytest.raises(LockHeldError, match="killed run"):
        with st.lock(lock, owner="new run"):
            pass
    with st.lock(lock, owner="new run", break_after_s=0):
        assert "new run" in st.read_bytes(lock).decode()
    assert not st.exists(lock)
    # Two threads racing for one lock: exactly one gets it.
    got, errors = [], []
    barrier = threading.Barrier(2)

    def take(name):
        barrier.wait()
        try:
            with st.lock(f"{hdfs.url}/locks/race.lock", owner=name):
                got.append(name)
                threading.Event().wait(1.0)
        except LockHeldError as e:
            errors.append(str(e))
    threads = [threading.Thread(target=take, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 1 and len(errors) == 1


@pytest.mark.slow
def test_delta_tables_and_saved_models_live_on_hdfs(hdfs, spark):
    from pyspark.ml.feature import StandardScaler, VectorAssembler
    from pyspark.ml import Pipeline, PipelineModel
    df = spark.createDataFrame([(float(i), float(i % 3)) for i in range(50)], ["a", "b"])
    table = f"{hdfs.url}/out/tables/t"
    df.write.format("delta").mode("overwrite").save(table)
    df.limit(10).write.format("delta").mode("append").save(table)
    assert spark.read.format("delta").load(table).count() == 60
    assert spark.read.format("delta").option("versionAsOf", 0).load(table).count() == 50
    model = Pipeline(stages=[VectorAssembler(inputCols=["a", "b"], outputCol="v"),
                             StandardScaler(inputCol="v", outputCol="s")]).fit(df)
    folder = f"{hdfs.url}/out/models/p"
    model.write().overwrite().save(folder)
    again = PipelineModel.load(folder)
    assert again.transform(df).select("s").collect() == model.transform(df).select("s").collect()
    assert "metadata" in Storage(spark).listdir(folder)
    assert os.path.basename(folder) == "p"
