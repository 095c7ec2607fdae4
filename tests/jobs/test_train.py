"""The train job's checkpoint key: the training data's content, not its Delta version number."""
import os
import shutil
import subprocess
import sys

import pytest

from sparkdeep import delta_io, lineage
from sparkdeep.config import load_config
from sparkdeep.pipelines.train import checkpoint_key


def test_a_recreated_table_at_the_same_version_gets_a_new_checkpoint_key(spark, repo_root, tmp_path):
    # Issue 11.3: the key was "train_prepared-v<version>-<settings>"; a table deleted and
    # written again restarts at version 0, so a new run on new rows loaded the old run's
    # finished checkpoint (and its lineage claimed the new rows).
    cfg = load_config(os.path.join(repo_root, "conf"), env="ci", overrides=[f"output_dir={tmp_path}"])
    path = str(tmp_path / "train_prepared")
    delta_io.write(spark.range(100).selectExpr("id", "id % 2 AS label"), path)
    old = checkpoint_key(cfg, lineage.fingerprint(delta_io.read(spark, path)))
    shutil.rmtree(path)
    delta_io.write(spark.range(50, 150).selectExpr("id", "id % 2 AS label"), path)
    assert delta_io.version_of(spark, path) == 0  # the same version number as before
    new = checkpoint_key(cfg, lineage.fingerprint(delta_io.read(spark, path)))
    assert new != old

    # The same rows and settings (a rerun after a kill) resume: the same key.
    same_rows = lineage.fingerprint(spark.range(50, 150).selectExpr("id", "id % 2 AS label").repartition(3))
    assert checkpoint_key(cfg, same_rows) == new
    other = load_config(os.path.join(repo_root, "conf"), env="ci",
                        overrides=[f"output_dir={tmp_path}", "train.learning_rate=0.01"])
    assert checkpoint_key(other, same_rows) != new
    assert new.startswith("train-") and len(new) <= 32
    # A forced run trains afresh: its folder is its own (run id and generation), not another's.
    forced = {checkpoint_key(cfg, same_rows, f) for f in (("r1", 1), ("r2", 0), ("r2", 1))}
    assert len(forced) == 3 and new not in forced and all(k.startswith(new + "-f") for k in forced)
    assert checkpoint_key(cfg, same_rows, ("r1", 1)) == checkpoint_key(cfg, same_rows, ("r1", 1))


@pytest.mark.parametrize("args, key", [(["--set", "train.learning_rate=.inf"], "train.learning_rate"),
                                       (["--set", "train.hidden_units=[]"], "train.hidden_units"),
                                       (["--output-dir", ""], "output_dir")])
def test_train_refuses_bad_values_before_starting(args, key, repo_root):
    out = subprocess.run([sys.executable, "-m", "sparkdeep.jobs.train", *args],
                         capture_output=True, text=True, timeout=120, cwd=repo_root)
    assert out.returncode == 2
    [line] = [x for x in out.stderr.splitlines() if x.strip()]
    assert line.startswith(f"train: config error: config key '{key}'")
