"""A stage's params written without a Spark job: the line MLlib writes, read back by MLlib's
reader and by the model store's checks; an existing folder refused unless overwriting."""
import json
import os

import pytest
from pyspark.ml.util import DefaultParamsReader, DefaultParamsWriter

from sparkdeep import model_store
from sparkdeep.transformers.hashing import HashIndexer
from sparkdeep.transformers.selection import VarianceSelector


def _line(folder):
    [name] = [n for n in os.listdir(os.path.join(folder, "metadata")) if n.startswith("part-")]
    with open(os.path.join(folder, "metadata", name)) as fh:
        lines = fh.read().splitlines()
    assert len(lines) == 1
    return json.loads(lines[0])


def test_the_metadata_is_mllibs_line_and_reads_back(spark, tmp_path):
    stage = HashIndexer(inputCols=["a b", "c"], outputCols=["a_i", "c_i"], numBuckets=17)
    ours, theirs = str(tmp_path / "ours"), str(tmp_path / "theirs")
    stage.write().save(ours)
    DefaultParamsWriter(stage).save(theirs)
    a, b = _line(ours), _line(theirs)
    assert a.pop("timestamp") > 0 and b.pop("timestamp") > 0
    assert a == b
    assert os.path.exists(os.path.join(ours, "metadata", ".part-00000.crc"))  # Hadoop's checksum, as Spark writes
    back = HashIndexer.load(ours)
    assert back.uid == stage.uid and back.getOrDefault("numBuckets") == 17
    assert back.getInputCols() == ["a b", "c"]
    assert DefaultParamsReader.loadMetadata(ours, spark)["uid"] == stage.uid
    model_store.check(spark, ours)  # the store's check reads it as it reads MLlib's


def test_an_existing_folder_is_refused_unless_overwriting(spark, tmp_path):
    path = str(tmp_path / "v")
    VarianceSelector(varianceThreshold=0.5).write().save(path)
    with pytest.raises(OSError, match="already exists.*overwrite"):
        VarianceSelector(varianceThreshold=0.25).write().save(path)
    assert VarianceSelector.load(path).getOrDefault("varianceThreshold") == 0.5  # nothing was written over it
    VarianceSelector(varianceThreshold=0.25).write().overwrite().save(path)
    assert VarianceSelector.load(path).getOrDefault("varianceThreshold") == 0.25
