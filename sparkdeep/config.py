"""Layered YAML config loaded once into frozen, validated dataclasses.

``conf/base/*.yaml`` is read first, then ``conf/<env>/*.yaml`` (keys there replace the
base's, mappings merge), then ``--set a.b=value`` overrides. Every key ends in a typed
dataclass field; an unknown key, a wrong type or a missing file is a :class:`ConfigError`
that names the key and the file it came from.

Example
-------
>>> cfg = load_config("conf", env="ci", overrides=["train.epochs=1"])  # doctest: +SKIP
>>> cfg.train.epochs  # doctest: +SKIP
1
"""
from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml


class ConfigError(ValueError):
    """A config key is unknown, has the wrong type, or a config file is missing/bad."""


@dataclass(frozen=True)
class SparkConfig:
    master: str = "local[2]"
    app_name: str = "sparkdeep"
    settings: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class DataConfig:
    dataset: str = "nycflights13"
    delay_threshold_min: int = 15
    sample_fraction: float = 1.0


@dataclass(frozen=True)
class PrepareConfig:
    holdout_fraction: float = 0.2
    majority_ratio: float = 1.0
    selector_top_fraction: float = 0.8
    max_correlation: float = 0.95
    pca_k: int = 16
    pca_variance_target: float = 0.9


@dataclass(frozen=True)
class TrainConfig:
    num_proc: int = 2
    epochs: int = 5
    batch_size: int = 256
    learning_rate: float = 0.002
    hidden_units: tuple[int, ...] = (64, 32)
    dropout: float = 0.1
    metrics: tuple[str, ...] = ("auc", "accuracy")
    validation_fraction: float = 0.1
    early_stopping_patience: int = 2
    accumulation_steps: int = 1
    compression: str = "none"
    scale_learning_rate: bool = True
    warmup_epochs: float = 1.0


@dataclass(frozen=True)
class TrackingConfig:
    enabled: bool = True
    uri: str = ""              # "" = SQLite under <output_dir>/mlflow; any MLflow tracking URI otherwise
    experiment: str = "sparkdeep"


@dataclass(frozen=True)
class Config:
    output_dir: str = "output"
    seed: int = 42
    spark: SparkConfig = field(default_factory=SparkConfig)
    data: DataConfig = field(default_factory=DataConfig)
    prepare: PrepareConfig = field(default_factory=PrepareConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)

    def __post_init__(self) -> None:
        checks = [
            ("data.sample_fraction", 0 < self.data.sample_fraction <= 1),
            ("prepare.holdout_fraction", 0 < self.prepare.holdout_fraction < 1),
            ("prepare.majority_ratio", self.prepare.majority_ratio > 0),
            ("prepare.selector_top_fraction", 0 < self.prepare.selector_top_fraction <= 1),
            ("prepare.max_correlation", 0 < self.prepare.max_correlation <= 1),
            ("prepare.pca_k", self.prepare.pca_k >= 0),
            ("prepare.pca_variance_target", 0 < self.prepare.pca_variance_target <= 1),
            ("train.num_proc", self.train.num_proc >= 1),
            ("train.epochs", self.train.epochs >= 1),
            ("train.batch_size", self.train.batch_size >= 1),
            ("train.learning_rate", self.train.learning_rate > 0),
            ("train.dropout", 0 <= self.train.dropout < 1),
            ("train.validation_fraction", 0 <= self.train.validation_fraction < 1),
            ("train.early_stopping_patience", self.train.early_stopping_patience >= 0),
            ("train.accumulation_steps", self.train.accumulation_steps >= 1),
            ("train.compression", self.train.compression in ("none", "fp16")),
            ("train.warmup_epochs", self.train.warmup_epochs >= 0),
            ("tracking.experiment", bool(self.tracking.experiment.strip())),
        ]
        for key, ok in checks:
            if not ok:
                section, name = key.split(".")
                value = getattr(getattr(self, section), name)
                raise ConfigError(f"config key {key!r}: value {value!r} is out of range")


# -- loading -----------------------------------------------------------------------------

def _merge(base: dict, over: Mapping, origins: dict, source: str, prefix: str = "") -> None:
    for key, value in over.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping) and isinstance(base.get(key), dict) and dotted != "spark.settings":
            _merge(base[key], value, origins, source, dotted + ".")
        elif isinstance(value, Mapping) and dotted == "spark.settings" and isinstance(base.get(key), dict):
            for k, v in value.items():
                base[key][k] = v
                origins[f"{dotted}.{k}"] = source
        else:
            base[key] = _plain(value)
            _record(origins, dotted, value, source)


def _plain(value: Any) -> Any:
    return {k: _plain(v) for k, v in value.items()} if isinstance(value, Mapping) else value


def _record(origins: dict, dotted: str, value: Any, source: str) -> None:
    origins[dotted] = source
    if isinstance(value, Mapping):
        for k, v in value.items():
            _record(origins, f"{dotted}.{k}", v, source)


def _read_dir(folder: Path, tree: dict, origins: dict, required: bool) -> None:
    if not folder.is_dir():
        if required:
            raise ConfigError(f"config folder {str(folder)!r} does not exist")
        return
    files = sorted(folder.glob("*.yaml"))
    if required and not files:
        raise ConfigError(f"config folder {str(folder)!r} holds no .yaml file")
    for path in files:
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {str(path)!r} is not valid YAML: {exc}") from None
        if not isinstance(data, Mapping):
            raise ConfigError(f"config file {str(path)!r} must hold a mapping at the top")
        _merge(tree, data, origins, str(path))


def _coerce(value: Any, tp: Any, key: str, source: str) -> Any:
    where = f"config key {key!r} (from {source})"
    if value is None:
        raise ConfigError(f"{where} has no value: it is required (set it there or with --set {key}=...)")
    origin = typing.get_origin(tp)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{where}: expected true/false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{where}: expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise ConfigError(f"{where}: expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{where}: expected a string, got {value!r}")
    if origin is tuple:
        (item_tp, _) = typing.get_args(tp)
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        return tuple(_coerce(v, item_tp, f"{key}[{i}]", source) for i, v in enumerate(value))
    if origin in (Mapping, dict, typing.Mapping) or tp is dict or _is_mapping(origin):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        # Spark settings are strings on the JVM side whatever YAML made of them.
        return types.MappingProxyType({str(k): str(v).lower() if isinstance(v, bool) else str(v)
                                       for k, v in value.items()})
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        return _build(tp, value, key + ".", source_of=None, default_source=source)
    raise ConfigError(f"{where}: unsupported type {tp!r}")  # pragma: no cover


def _build(cls: type, tree: Mapping, prefix: str, source_of: dict | None = None,
           default_source: str = "defaults") -> Any:
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        source = _source(source_of, dotted, default_source)
        if key not in names:
            known = ", ".join(sorted(names))
            raise ConfigError(f"unknown config key {dotted!r} in {source} (known here: {known})")
        tp = hints[key]
        if dataclasses.is_dataclass(tp):
            if not isinstance(value, Mapping):
                raise ConfigError(f"config key {dotted!r} (from {source}): expected a mapping, got {value!r}")
            kwargs[key] = _build(tp, value, dotted + ".", source_of, default_source)
        else:
            kwargs[key] = _coerce(value, tp, dotted, source)
    return cls(**kwargs)


def _source(origins: dict | None, dotted: str, default: str) -> str:
    if not origins:
        return default
    if dotted in origins:
        return origins[dotted]
    children = [v for k, v in origins.items() if k.startswith(dotted + ".")]
    return children[0] if children else default


def _is_mapping(origin: Any) -> bool:
    import collections.abc
    return origin is collections.abc.Mapping


def parse_override(text: str) -> tuple[str, Any]:
    """``"train.epochs=3"`` -> ``("train.epochs", 3)``; the value is read as YAML."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like key=value")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"override {text!r} has an empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key, value


def load_config(conf_dir: str | Path = "conf", env: str | None = None,
                overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Load ``conf_dir/base``, then ``conf_dir/<env>``, then ``key=value`` overrides."""
    conf_dir = Path(conf_dir)
    tree: dict = {}
    origins: dict = {}
    _read_dir(conf_dir / "base", tree, origins, required=True)
    if env:
        _read_dir(conf_dir / env, tree, origins, required=True)
    for text in overrides:
        key, value = parse_override(text)
        nested: dict = {}
        cursor = nested
        parts = key.split(".")
        if key.startswith("spark.settings.") and len(parts) > 2:
            # Spark keys contain dots themselves: spark.settings.<spark.key>.
            parts = ["spark", "settings", key[len("spark.settings."):]]
        for part in parts[:-1]:
            cursor = cursor.setdefault(part, {})
        cursor[parts[-1]] = value
        _merge(tree, nested, origins, f"--set {text}")
    try:
        return _build(Config, tree, "", origins)
    except TypeError as exc:  # a dataclass missing a required value
        raise ConfigError(f"config is incomplete: {exc}") from None


def default_conf_dir() -> Path:
    """``$SPARKDEEP_CONF_DIR``, else the repo's ``conf/`` from a checkout, else ``./conf``."""
    import os
    if os.environ.get("SPARKDEEP_CONF_DIR"):
        return Path(os.environ["SPARKDEEP_CONF_DIR"])
    here = Path(__file__).resolve().parent.parent / "conf"
    return here if here.is_dir() else Path("conf")
