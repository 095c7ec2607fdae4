import dataclasses
import shutil
import typing

import pytest

from sparkdeep.config import Config, ConfigError, load_config


def write(folder, name, text):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(text)


@pytest.fixture
def conf(tmp_path, repo_root):
    # The repo's base (where every default lives), then this test's own base file over it.
    shutil.copytree(f"{repo_root}/conf/base", tmp_path / "base")
    shutil.copytree(f"{repo_root}/conf/datasets", tmp_path / "datasets")  # data.dataset names a spec here
    write(tmp_path / "base", "test.yaml", "seed: 7\ntrain:\n  epochs: 3\n  hidden_units: [8, 4]\n"
                                          "spark:\n  master: local[1]\n  settings:\n    spark.a: 1\n")
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
    assert cfg.spark.settings["spark.a"] == "1" and cfg.spark.settings["spark.b.c"] == "x"
    assert cfg.spark.master == "local[1]"
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


def test_min_category_count_is_at_least_one_and_for_the_embedding_encoding_only(conf):
    assert load_config(conf).prepare.min_category_count == 1
    assert load_config(conf, overrides=["prepare.min_category_count=5"]).prepare.min_category_count == 5
    for bad in (["prepare.min_category_count=0"], ["prepare.min_category_count=3", "prepare.encoding=onehot"]):
        with pytest.raises(ConfigError, match="prepare.min_category_count"):
            load_config(conf, overrides=bad)


def test_hash_buckets_are_off_by_default_and_need_the_embedding_encoding(conf):
    assert load_config(conf).prepare.hash_buckets == 0
    assert load_config(conf, overrides=["prepare.hash_buckets=65536"]).prepare.hash_buckets == 65536
    for bad in (["prepare.hash_buckets=1"], ["prepare.hash_buckets=-3"], [f"prepare.hash_buckets={2 ** 30 + 1}"],
                ["prepare.hash_buckets=1024", "prepare.encoding=onehot"]):
        with pytest.raises(ConfigError, match="prepare.hash_buckets.*expected 0 .every level its own index"):
            load_config(conf, overrides=bad)


def test_config_is_frozen(conf):
    cfg = load_config(conf)
    with pytest.raises(Exception):
        cfg.train.epochs = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        cfg.spark.settings["spark.a"] = "2"  # type: ignore[index]


def _float_keys(cls=Config, prefix=""):
    """Every float field of the config, as a dotted key."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            yield from _float_keys(tp, f"{prefix}{f.name}.")
        elif tp is float:
            yield f"{prefix}{f.name}"


FLOAT_KEYS = list(_float_keys())


@pytest.mark.parametrize("value", [".inf", "-.inf", ".nan"])
@pytest.mark.parametrize("key", FLOAT_KEYS)
def test_a_non_finite_number_is_an_error_for_every_float_key(conf, key, value):
    # Issue 11.5: train.learning_rate=.inf passed validation and trained a NaN model.
    with pytest.raises(ConfigError, match=rf"'{key}' \(from --set {key}={value}\).*finite"):
        load_config(conf, overrides=[f"{key}={value}"])


def test_a_non_finite_number_in_a_file_names_key_and_file(conf):
    write(conf / "dev", "pipeline.yaml", "train:\n  learning_rate: .inf\n")
    with pytest.raises(ConfigError, match=r"'train.learning_rate' \(from .*dev/pipeline.yaml\).*finite"):
        load_config(conf, env="dev")
    assert len(FLOAT_KEYS) >= 10 and "train.learning_rate" in FLOAT_KEYS


@pytest.mark.parametrize("override, key", [
    ("train.hidden_units=[]", "train.hidden_units"),
    ("train.hidden_units=[64, -5]", "train.hidden_units"),
    ("train.hidden_units=[0]", "train.hidden_units"),
    ("train.metrics=[auc, f1]", "train.metrics"),
    ("output_dir=", "output_dir"),
    ("output_dir=' '", "output_dir"),
    ("output_dir=file://tmp/out", "output_dir"),  # the host "tmp", not /tmp/out
    ("output_dir=file://", "output_dir"),  # no folder: the working directory
    ("gate.metric=f1", "gate.metric"),
    ("baselines.models=[gbt, gbt]", "baselines.models"),
    ("baselines.models=[lightgbm]", "baselines.models"),
    ("baselines.trees=0", "baselines.trees"),
    ("baselines.depth=30", "baselines.depth"),
    ("gate.min_value=1.5", "gate.min_value"),
    ("gate.max_regression=-0.1", "gate.max_regression"),
    ("train.optimizer=adamx", "train.optimizer"),
])
def test_values_that_would_fail_late_are_config_errors(conf, override, key):
    with pytest.raises(ConfigError, match=rf"'{key}'.*out of range"):
        load_config(conf, overrides=[override])


@pytest.mark.parametrize("overrides, key", [
    (["train.strategy=ps"], "train.strategy"),
    (["train.strategy=collective", "train.compression=fp16"], "train.compression"),
    (["train.strategy=local_sgd", "train.accumulation_steps=4"], "train.accumulation_steps"),
    (["train.strategy=local_sgd", "train.local_steps=0"], "train.local_steps"),
    (["train.strategy=parameter_server", "train.accumulation_steps=2"], "train.accumulation_steps"),
    (["train.strategy=parameter_server", "train.compression=fp16"], "train.compression"),
    (["train.stall_timeout=0"], "train.stall_timeout"),
    (["train.strategy=local_sgd", "train.shard_embeddings_above=1000000"], "train.shard_embeddings_above"),
    (["train.shard_embeddings_above=-1"], "train.shard_embeddings_above"),
])
def test_a_strategy_and_params_it_does_not_use_are_refused_before_any_step(conf, overrides, key):
    with pytest.raises(ConfigError, match=rf"'{key}'.*(out of range|applies to .*, not train.strategy=)"):
        load_config(conf, overrides=overrides)
    assert load_config(conf, overrides=["train.strategy=local_sgd", "train.local_steps=4"]).train.local_steps == 4
    assert load_config(conf, overrides=["train.compression=fp16"]).train.strategy == "horovod"
    assert load_config(conf, overrides=["train.shard_embeddings_above=1000000"]).train.shard_embeddings_above == 10**6
    assert load_config(conf, overrides=["train.optimizer=lazy_adam"]).train.optimizer == "lazy_adam"
    # The default scale_learning_rate (true) does not stop parameter_server: the train job
    # passes it to the synchronous strategies only.
    assert load_config(conf, overrides=["train.strategy=parameter_server"]).train.scale_learning_rate is True


def test_an_output_folder_on_hdfs_needs_a_tracking_store_of_its_own(conf):
    # MLflow's default store is a SQLite file under the output folder, which only a local folder can hold.
    with pytest.raises(ConfigError, match=r"'tracking.uri'.*output_dir is not local \(hdfs://nn:8020/out\)"):
        load_config(conf, overrides=["output_dir=hdfs://nn:8020/out"])
    assert load_config(conf, overrides=["output_dir=hdfs://nn:8020/out", "tracking.enabled=false"])
    assert load_config(conf, overrides=["output_dir=s3a://b/out", "tracking.uri=sqlite:////tmp/m.db"])
    assert load_config(conf, overrides=["output_dir=file:///tmp/out"])


def test_metric_names_are_those_the_ranks_build_for_a_binary_network(conf):
    from sparkdeep import tasks
    names = sorted(tasks.METRICS["binary"])
    cfg = load_config(conf, overrides=[f"train.metrics=[{', '.join(names)}, AUC]"])
    assert cfg.train.metrics == (*names, "AUC")
    # A name no task has fails before the spec is read (the message lists every task's names);
    # a regression metric fails for the default spec's binary network.
    with pytest.raises(ConfigError, match=r"'train.metrics'.*expected metric names from \['accuracy', 'auc'"):
        load_config(conf, overrides=["train.metrics=[auc, f1]"])
    with pytest.raises(ConfigError, match=r"'train.metrics'.*expected binary metric names from \['accuracy', 'auc'"):
        load_config(conf, overrides=["train.metrics=[auc, mse]"])


def test_yaml_aliases_are_refused_and_errors_stay_short(conf):
    # A "billion laughs" document: 9 levels of 9 aliases each is 387 million items.
    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(8))
    write(conf / "dev", "pipeline.yaml", bomb + "train:\n  metrics: *i\n")
    with pytest.raises(ConfigError) as err:
        load_config(conf, env="dev")
    assert "aliases" in str(err.value) and "dev/pipeline.yaml" in str(err.value) and len(str(err.value)) < 500
    with pytest.raises(ConfigError, match="aliases"):
        load_config(conf, overrides=["train.metrics=[&a auc, *a]"])

    write(conf / "dev", "pipeline.yaml", "train:\n  epochs: [" + ", ".join(["x" * 100] * 10_000) + "]\n")
    with pytest.raises(ConfigError) as err:
        load_config(conf, env="dev")
    assert "'train.epochs'" in str(err.value) and "characters)" in str(err.value) and len(str(err.value)) < 500


def test_every_key_has_its_default_in_base_only(conf):
    # Defaults live once, in conf/base: a key missing there is an error, not a hidden default.
    text = (conf / "base" / "pipeline.yaml").read_text().replace("  dropout: 0.1\n", "")
    (conf / "base" / "pipeline.yaml").write_text(text)
    with pytest.raises(ConfigError, match=r"'train.dropout' is missing"):
        load_config(conf)
    # ``dataset`` is no config key: load_config attaches the spec that data.dataset names.
    assert all(f.default is dataclasses.MISSING for f in dataclasses.fields(Config) if f.name != "dataset")
    assert load_config(conf, overrides=["train.dropout=0.1"]).dataset.name == "flights"


def test_the_compress_section_is_off_by_default_and_checked(conf):
    cfg = load_config(conf)
    assert cfg.compress.enabled is False and "int8" in cfg.compress.variants
    with pytest.raises(ConfigError, match=r"'compress.variants'.*int3"):
        load_config(conf, overrides=["compress.variants=[int8, int3]"])
    with pytest.raises(ConfigError, match=r"'compress.sparsity'"):
        load_config(conf, overrides=["compress.sparsity=1.0"])
    with pytest.raises(ConfigError, match=r"'compress.alpha'"):
        load_config(conf, overrides=["compress.alpha=1.5"])
    assert load_config(conf, overrides=["compress.student_units=[16, 8]"]).compress.student_units == (16, 8)


def test_config_and_the_estimator_refuse_the_same_settings_for_each_strategy(conf):
    """One rule (each strategy's declaration in sparkdeep.registry), asked by both."""
    from sparkdeep.registry import STRATEGY_RULES, STRATEGY_SETTINGS
    from sparkdeep.transformers.keras.estimator import DistributedKerasEstimator
    used = {"compression": "fp16", "accumulation_steps": 2, "measure_wait": True}
    in_config = set(vars(load_config(conf).train))
    for strategy in STRATEGY_RULES:
        for key, value in used.items():
            taken = key in STRATEGY_RULES[strategy].takes
            config_refuses = not taken  # a setting config does not have is the estimator's alone
            if key in in_config:
                try:
                    load_config(conf, overrides=[f"train.strategy={strategy}", f"train.{key}={str(value).lower()}"])
                    config_refuses = False
                except ConfigError as exc:
                    config_refuses = f"'train.{key}'" in str(exc)
            est = DistributedKerasEstimator(strategy=strategy, **{STRATEGY_SETTINGS[key].param: value})
            try:
                est._check_strategy_params()
                estimator_refuses = False
            except ValueError as exc:
                estimator_refuses = STRATEGY_SETTINGS[key].param in str(exc)
            assert config_refuses is estimator_refuses is (not taken), (strategy, key)


def test_the_estimator_s_defaults_are_conf_base_s_train_settings(repo_root):
    """One home per default: a bare estimator trains with the settings ``make run`` uses."""
    from sparkdeep.transformers.keras.estimator import DistributedKerasEstimator
    from sparkdeep.transformers.keras.params import FROM_CONF_BASE
    train, est = load_config(f"{repo_root}/conf").train, DistributedKerasEstimator()
    assert {"epochs", "learningRate", "lrSchedule", "validationFraction", "earlyStoppingPatience"} <= set(FROM_CONF_BASE)
    for param, key in FROM_CONF_BASE.items():
        value = getattr(train, key)
        assert est.getOrDefault(param) == value, (param, key)
        assert not est.isSet(param)  # a default, so a saved estimator records it as one
