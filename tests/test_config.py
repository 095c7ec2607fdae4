import pytest

from sparkdeep.config import ConfigError, load_config


def write(folder, name, text):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(text)


@pytest.fixture
def conf(tmp_path):
    write(tmp_path / "base", "pipeline.yaml", "seed: 7\ntrain:\n  epochs: 3\n  hidden_units: [8, 4]\n")
    write(tmp_path / "base", "spark.yaml", "spark:\n  master: local[1]\n  settings:\n    spark.a: 1\n")
    write(tmp_path / "dev", "pipeline.yaml", "train:\n  epochs: 9\n")
    return tmp_path


def test_repo_config_loads_with_every_overlay(repo_root):
    base = load_config(f"{repo_root}/conf")
    assert base.train.num_proc == 2 and base.data.sample_fraction == 1.0
    assert base.spark.settings["spark.task.maxFailures"] == "1"
    for env in ("local", "ci"):
        assert load_config(f"{repo_root}/conf", env=env).seed == base.seed
    assert load_config(f"{repo_root}/conf", env="ci").data.sample_fraction < 1.0


def test_overlay_and_override_precedence(conf):
    cfg = load_config(conf, env="dev", overrides=["train.epochs=11", "spark.settings.spark.b.c=x"])
    assert cfg.seed == 7
    assert cfg.train.epochs == 11
    assert cfg.train.hidden_units == (8, 4)
    assert dict(cfg.spark.settings) == {"spark.a": "1", "spark.b.c": "x"}
    assert load_config(conf, env="dev").train.epochs == 9


def test_unknown_key_names_key_and_file(conf):
    write(conf / "base", "extra.yaml", "train:\n  epoks: 3\n")
    with pytest.raises(ConfigError) as err:
        load_config(conf)
    assert "'train.epoks'" in str(err.value) and "extra.yaml" in str(err.value)


def test_wrong_type_names_key_and_file(conf):
    write(conf / "dev", "pipeline.yaml", "train:\n  epochs: many\n")
    with pytest.raises(ConfigError) as err:
        load_config(conf, env="dev")
    assert "'train.epochs'" in str(err.value) and "dev/pipeline.yaml" in str(err.value)


def test_override_type_error_names_the_override(conf):
    with pytest.raises(ConfigError, match=r"train.batch_size.*--set train.batch_size=big"):
        load_config(conf, overrides=["train.batch_size=big"])


def test_missing_value_names_key_and_file(conf):
    write(conf / "dev", "pipeline.yaml", "output_dir:\n")
    with pytest.raises(ConfigError) as err:
        load_config(conf, env="dev")
    assert "'output_dir'" in str(err.value) and "dev/pipeline.yaml" in str(err.value) and "required" in str(err.value)
    assert load_config(conf, env="dev", overrides=["output_dir=/shared/x"]).output_dir == "/shared/x"


def test_cluster_overlay_requires_a_shared_output_dir(repo_root):
    with pytest.raises(ConfigError, match=r"'output_dir' \(from .*conf/cluster/pipeline.yaml\)"):
        load_config(f"{repo_root}/conf", env="cluster")
    cfg = load_config(f"{repo_root}/conf", env="cluster", overrides=["output_dir=/mnt/shared/sd"])
    assert cfg.spark.settings["spark.executor.cores"] == "1"


def test_missing_config_folder_or_file_names_the_path(tmp_path):
    with pytest.raises(ConfigError, match=f"{tmp_path}/nowhere/base"):
        load_config(tmp_path / "nowhere")
    (tmp_path / "empty" / "base").mkdir(parents=True)
    with pytest.raises(ConfigError, match="holds no .yaml file"):
        load_config(tmp_path / "empty")


def test_missing_env_folder_is_an_error(conf):
    with pytest.raises(ConfigError, match="nope"):
        load_config(conf, env="nope")


def test_out_of_range_value_is_named(conf):
    with pytest.raises(ConfigError, match="prepare.holdout_fraction"):
        load_config(conf, overrides=["prepare.holdout_fraction=1.5"])


def test_config_is_frozen(conf):
    cfg = load_config(conf)
    with pytest.raises(Exception):
        cfg.train.epochs = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        cfg.spark.settings["spark.a"] = "2"  # type: ignore[index]
