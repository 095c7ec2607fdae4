import pytest

from sparkdeep import delta_io


def test_write_read_and_time_travel(spark, tmp_path):
    path = str(tmp_path / "t")
    v0 = delta_io.write(spark.range(5), path)
    v1 = delta_io.write(spark.range(7), path)
    assert (v0.version, v1.version) == (0, 1)
    assert delta_io.read(spark, path).count() == 7
    assert delta_io.read(spark, path, version=0).count() == 5
    assert delta_io.version_of(spark, path) == 1


def test_retried_append_with_same_txn_adds_no_rows(spark, tmp_path):
    path = str(tmp_path / "appends")
    for _ in range(5):  # a scheduler retrying the same step five times
        delta_io.write(spark.range(10), path, mode="append", txn=("run-1/ingest", 0))
    assert delta_io.read(spark, path).count() == 10
    delta_io.write(spark.range(10), path, mode="append", txn=("run-1/ingest", 1))
    assert delta_io.read(spark, path).count() == 20


def test_reading_a_missing_table_names_the_path(spark, tmp_path):
    missing = str(tmp_path / "nothing-here")
    with pytest.raises(FileNotFoundError, match="nothing-here"):
        delta_io.read(spark, missing)


def test_version_of_follows_commits_it_did_not_make(spark, tmp_path):
    from delta.tables import DeltaTable
    path = str(tmp_path / "v")
    delta_io.write(spark.range(3), path)
    assert delta_io.version_of(spark, path) == 0
    for n in range(2):  # commits made around delta_io, as another process or user would
        spark.range(n + 1).write.format("delta").mode("append").save(path)
    DeltaTable.forPath(spark, path).delete("id = 0")
    history = DeltaTable.forPath(spark, path).history(1).select("version").first()["version"]
    assert delta_io.version_of(spark, path) == history == 3
