"""Distributed Keras training as an MLlib Estimator.

``DistributedKerasEstimator.fit(df)`` runs one Spark barrier stage of ``numProc`` tasks over
``df`` repartitioned ``numProc`` ways; each task spills its own partition to its local
disk and starts one rank that streams it through a bounded shuffle window every epoch
(``sparkdeep.distributed``, :mod:`.feed`), agreeing with the others by the ``strategy``
param (:mod:`.strategies`), and ``fit`` returns a :class:`~.model.DistributedKerasModel`
holding the trained network as ``.keras`` bytes.

Example
-------
>>> est = DistributedKerasEstimator(featuresCol="features", labelCol="label",
...                                 numProc=2, epochs=3)       # doctest: +SKIP
>>> model = est.fit(train_df)                                   # doctest: +SKIP
>>> model.transform(test_df).select("probability", "prediction")  # doctest: +SKIP
"""
from __future__ import annotations

import json
import logging
import math
import os
import time
from typing import Any

from pyspark import keyword_only
from pyspark.ml import Estimator
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import HasLabelCol, HasSeed, HasWeightCol
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from sparkdeep import tasks
from sparkdeep.distributed import run_on_ranks
from sparkdeep.names import quoted
from sparkdeep.registry import STRATEGY_SETTINGS, Choices, strategy_conflicts, strategy_rule, strategy_takes

from ..keras_models import DEFAULT_BUILDERS
from ..sampling import with_row_draw
from . import rank_loop, strategies
from .checkpoints import CheckpointStore, check_signature, read_checkpoint, checkpoint_signature
from .contract import RankSpec, Staged
from .feed import ShardSpill, chunk_rows_for
from .model import DistributedKerasModel
from .profile import launch_breakdown, profile_summary
from .optimizers import check_optimizer
from .sharding import assemble_checkpoint, for_ranks
from .network import (builder_parameters, resolve_builder, check_labels, check_network, keras_from_bytes, keras_to_bytes,
                      network_output)
from .params import (CheckpointParams, RunParams, NetworkParams, ScoringParams,
                     ValidationParams)
from .staging import apply_handle_invalid, check_training_rows, float_arrays, task_slots

log = logging.getLogger(__name__)

#: Working columns of the staged rows while the validation split is drawn.
_ROW_ID, _DRAW = "__row_id", "__validation_draw"


class DistributedKerasEstimator(Estimator, ScoringParams, NetworkParams, RunParams,
                            ValidationParams, CheckpointParams, HasLabelCol, HasWeightCol, HasSeed):
    """Train a Keras 3 model on ``numProc`` Horovod ranks launched by Spark.

    The network comes from ``model`` (a ``keras.Model``, shipped as ``.keras`` bytes:
    what a notebook user writes) or from ``modelBuilder`` (``"module:function"`` called
    with ``input_dim`` and ``modelArgs``: what a job or a saved estimator uses).
    """

    softLabels = Param(Params._dummy(), "softLabels",
                       "binary task only: labels may be probabilities in [0, 1] (a distillation target), "
                       "not only 0/1", typeConverter=TypeConverters.toBoolean)

    @keyword_only
    def __init__(self, *, model: Any = None, featuresCol: str = "features", labelCol: str = "label",
                 weightCol: str | None = None, predictionCol: str = "prediction",
                 probabilityCol: str = "probability", modelBuilder: str | None = None,
                 modelArgs: str | dict | None = None, loss: str | None = None,
                 optimizer: str | None = None, learningRate: float | None = None,
                 metrics: list[str] | None = None, numProc: int | None = None, epochs: int | None = None,
                 scheduleEpochs: int | None = None,
                 batchSize: int | None = None, accumulationSteps: int | None = None,
                 compression: str | None = None, scaleLearningRate: bool | None = None,
                 warmupEpochs: float | None = None, lrSchedule: str | None = None,
                 validationFraction: float | None = None,
                 validationCol: str | None = None, rowIdCol: str | None = None,
                 earlyStoppingPatience: int | None = None,
                 runId: str | None = None, checkpointDir: str | None = None,
                 shuffleBufferRows: int | None = None, seed: int | None = None, handleInvalid: str | None = None,
                 stallTimeout: float | None = None, strategy: str | None = None, localSteps: int | None = None,
                 measureWait: bool | None = None, traceDir: str | None = None, traceEpoch: int | None = None,
                 softLabels: bool | None = None, shardEmbeddingsAbove: int | None = None):
        super().__init__()
        self._setDefault(seed=42, softLabels=False)
        self._model_bytes: bytes | None = None
        self.setParams(**self._input_kwargs)

    @keyword_only
    def setParams(self, **kwargs: Any) -> "DistributedKerasEstimator":
        kwargs = {k: v for k, v in kwargs.items() if v is not None}
        if "model" in kwargs:
            self.setModel(kwargs.pop("model"))
        if isinstance(kwargs.get("modelArgs"), dict):
            kwargs["modelArgs"] = json.dumps(kwargs["modelArgs"], sort_keys=True)
        return self._set(**kwargs)

    def setModel(self, model) -> "DistributedKerasEstimator":
        """Train this ``keras.Model`` (its architecture and initial weights)."""
        self._model_bytes = keras_to_bytes(model)
        return self

    def _validate(self, dataset: DataFrame) -> None:
        schema = dataset.schema
        self._check_features(schema)
        label = self.getLabelCol()
        if label not in schema.fieldNames():
            raise ValueError(f"labelCol {label!r} is not a column of the input")
        if not isinstance(schema[label].dataType, T.NumericType):
            raise TypeError(f"labelCol {label!r} must be numeric, got "
                            f"{schema[label].dataType.simpleString()}")
        if self.isDefined(self.weightCol) and self.getWeightCol():
            wcol = self.getWeightCol()
            if wcol not in schema.fieldNames() or not isinstance(schema[wcol].dataType, T.NumericType):
                raise ValueError(f"weightCol {wcol!r} must be a numeric column of the input")
        for name, value, low in (("numProc", self.getNumProc(), 1), ("epochs", self.getEpochs(), 1),
                                 ("batchSize", self.getBatchSize(), 1),
                                 ("shuffleBufferRows", self.getOrDefault(self.shuffleBufferRows), 1)):
            if value < low:
                raise ValueError(f"{name} must be >= {low}, got {value}")
        schedule = self.getOrDefault(self.scheduleEpochs)
        if schedule and schedule < self.getEpochs():
            raise ValueError(f"scheduleEpochs must be 0 (= epochs) or >= epochs={self.getEpochs()} (the schedule a "
                             f"fit stopped at epochs follows), got {schedule}")
        if not (math.isfinite(self.getLearningRate()) and self.getLearningRate() > 0):
            raise ValueError(f"learningRate must be a finite number > 0, got {self.getLearningRate()}")
        stall = self.getOrDefault(self.stallTimeout)
        if not (math.isfinite(stall) and stall > 0):
            raise ValueError(f"stallTimeout must be a finite number of seconds > 0, got {stall}")
        if self.getHandleInvalid() not in ("error", "skip"):
            raise ValueError(f"handleInvalid must be 'error' or 'skip' at fit, got {self.getHandleInvalid()!r}")
        task = self.getTask()
        if self.getOrDefault(self.softLabels) and task != "binary":
            raise ValueError(f"softLabels=True applies to a binary network (one sigmoid unit trained on "
                             f"probabilities); this loss trains a {task} network")
        for name in self.getOrDefault(self.metrics):
            tasks.metric_class(name, task)
        if self.getOrDefault(self.accumulationSteps) < 1:
            raise ValueError(f"accumulationSteps must be >= 1, got {self.getOrDefault(self.accumulationSteps)}")
        strategy_rule(self.getOrDefault(self.strategy))
        check_optimizer(self.getOrDefault(self.optimizer))
        for param, allowed in ((self.lrSchedule, Choices.LR_SCHEDULES), (self.compression, Choices.COMPRESSIONS)):
            if self.getOrDefault(param) not in allowed:
                raise ValueError(f"{param.name} must be one of {', '.join(map(repr, allowed))}, "
                                 f"got {self.getOrDefault(param)!r}")
        self._check_strategy_params()
        frac, vcol = self.getOrDefault(self.validationFraction), self.getOrDefault(self.validationCol)
        if not 0 <= frac < 1:
            raise ValueError(f"validationFraction must be in [0, 1), got {frac}")
        if vcol and frac and self.isSet(self.validationFraction):
            raise ValueError("set validationCol or validationFraction, not both")
        if vcol and (vcol not in schema.fieldNames() or not isinstance(schema[vcol].dataType, T.BooleanType)):
            raise ValueError(f"validationCol {vcol!r} must be a boolean column of the input")
        rid = self.getOrDefault(self.rowIdCol)
        if rid and rid not in schema.fieldNames():
            raise ValueError(f"rowIdCol {rid!r} is not a column of the input (columns: "
                             f"{', '.join(schema.fieldNames())})")
        if self.getOrDefault(self.earlyStoppingPatience) < 0:
            raise ValueError("earlyStoppingPatience must be >= 0")
        if self.getOrDefault(self.traceDir) and not 1 <= self.getOrDefault(self.traceEpoch) <= self.getEpochs():
            raise ValueError(f"traceEpoch must be between 1 and epochs={self.getEpochs()} (the epoch TensorFlow's "
                             f"profiler traces), got {self.getOrDefault(self.traceEpoch)}")
        self.checkpoint_folder()
        master = dataset.sparkSession.sparkContext.getConf().get("spark.master", "")
        slots = task_slots(dataset.sparkSession.sparkContext, self.getNumProc())
        if self.getNumProc() > slots:
            raise ValueError(f"numProc={self.getNumProc()} exceeds the {slots} tasks Spark can run at once "
                             f"(master {master!r}); every rank needs a concurrent task, or the launch would "
                             "wait forever: lower numProc or add executor cores")
        if self._model_bytes is None:
            resolve_builder(self._builder_name())
        try:
            self.getModelArgs()
        except json.JSONDecodeError as exc:
            raise ValueError(f"modelArgs is not a JSON object: {exc}") from None

    def _check_strategy_params(self) -> None:
        """A param the chosen strategy does not take is an error, not silently ignored: the
        strategy's own declaration (:data:`sparkdeep.registry.STRATEGY_RULES`) says which."""
        if self.getOrDefault(self.localSteps) < 1:
            raise ValueError(f"localSteps must be >= 1, got {self.getOrDefault(self.localSteps)}")
        if self.getOrDefault(self.shardEmbeddingsAbove) < 0:
            raise ValueError(f"shardEmbeddingsAbove must be >= 0 bytes (0 = never split a table), got "
                             f"{self.getOrDefault(self.shardEmbeddingsAbove)}")
        given = {key: self.getOrDefault(self.getParam(s.param)) for key, s in STRATEGY_SETTINGS.items()
                 if self.isSet(self.getParam(s.param))}
        conflicts = strategy_conflicts(self.getOrDefault(self.strategy), given)
        if conflicts:
            raise ValueError("; ".join(conflicts.values()))

    def _builder_name(self) -> str:
        return self.getModelBuilder() or DEFAULT_BUILDERS[self.getTask()]

    def _network(self, input_dim: int, labels: dict) -> tuple[bytes, list]:
        """The network to train as ``.keras`` bytes, checked against the task and labels, and
        its structure (each layer's class and weight shapes, for checkpoint signatures)."""
        task = self.getTask()
        if self._model_bytes is not None:
            data = self._model_bytes
            net = keras_from_bytes(data)
        else:
            args = self.getModelArgs()
            builder = resolve_builder(self._builder_name())
            takes = builder_parameters(builder)
            if task == "multiclass" and "num_classes" in takes and "num_classes" not in args:
                args["num_classes"] = max(2, int(labels["max"]) + 1)
            if task == "regression" and "target_mean" in takes and "target_mean" not in args:
                # Learn a standardised target; the network's last layer maps it back to units.
                args["target_mean"] = float(labels.get("mean") or 0.0)
                args["target_scale"] = float(labels.get("std") or 0.0) or 1.0
            net = builder(input_dim, **args)
            data = None
        units, activation = network_output(net)
        width = int(net.inputs[0].shape[-1]) if net.inputs and net.inputs[0].shape[-1] is not None else input_dim
        if width != input_dim:
            raise ValueError(f"the network takes {width} inputs but featuresCol {self.getFeaturesCol()!r} holds "
                             f"vectors of length {input_dim}")
        check_network(task, self.getOrDefault(self.loss), units, activation)
        # Soft labels (probabilities, as distillation gives) are fractional by design; the range still holds.
        soft = self.getOrDefault(self.softLabels)
        check_labels(task, units, dict(labels, fractional=0) if soft else labels, self.getLabelCol())
        layers = [[type(layer).__name__, [list(w.shape) for w in layer.weights]] for layer in net.layers]
        return (data if data is not None else keras_to_bytes(net)), layers

    def _fit(self, dataset: DataFrame) -> "DistributedKerasModel":
        """Check, stage, resume or launch, summarise: each step is a method below."""
        self._validate(dataset)
        t_launch = time.time()
        staged, has_validation = self._staged(dataset)
        staged, checked, skipped = self._checked_rows(staged)
        model_bytes, layers = self._network(checked["width"], checked)
        folder = self.checkpoint_folder()
        signature = checkpoint_signature(
            input_dim=checked["width"], rows=checked["rows"] - skipped, task=self.getTask(),
            loss=self.getOrDefault(self.loss).lower(), optimizer=self.getOrDefault(self.optimizer),
            weighted=bool(self._weight_col()), network=layers,
            validation=self.getOrDefault(self.validationCol) or self.validation_share()) if folder else None
        resume = read_checkpoint(folder) if folder else None
        if resume:
            check_signature(folder, self.getOrDefault(self.runId), resume["signature"], signature)
            finished = self._finished_run(resume, checked["width"], skipped)
            if finished is not None:
                return finished
        spec = self._rank_spec(model_bytes, has_validation, folder, resume)
        if resume:
            log.info("[train] resuming run %r after epoch %s",
                     self.getOrDefault(self.runId), resume['completed_epochs'])
        t_staged = time.time()
        spill = ShardSpill(split_col=Staged.IS_VALIDATION if has_validation else None,
                           chunk_rows=chunk_rows_for(spec.shuffle_buffer_rows))
        # Split tables: the ranks start with none of their rows, which they ask the driver for.
        launched, tables = for_ranks(spec, self.getNumProc())
        store = CheckpointStore(folder, signature, network=model_bytes if tables else None, size=self.getNumProc(),
                                assemble=assemble_checkpoint if tables else None) if folder else None
        try:
            results = run_on_ranks(rank_loop.train_rank, (launched,), num_proc=self.getNumProc(), data=staged,
                                   spill=spill, stall_timeout=self.getOrDefault(self.stallTimeout), on_put=store,
                                   on_get=tables, backend=strategies.backend_for(spec.strategy),
                                   shuffle_seed=spec.seed, preload=("tensorflow",))
        finally:
            if store is not None:
                store.close()
        del launched, tables
        summary = _summary(results, spec, resume, input_dim=checked["width"], skipped=skipped,
                           times=(t_launch, t_staged, time.time()))
        return self._model(_trained_network(results, model_bytes, spec), summary)

    def _weight_col(self) -> str | None:
        return self.getWeightCol() if self.isDefined(self.weightCol) and self.getWeightCol() else None

    def _staged(self, dataset: DataFrame) -> tuple[DataFrame, bool]:
        """The input as the ranks read it (float arrays, float labels and weights, the
        validation mark), and whether it has validation rows."""
        fcol, lcol, wcol = self.getFeaturesCol(), self.getLabelCol(), self._weight_col()
        feats = float_arrays(dataset.schema, fcol)
        cols = [feats.alias(Staged.FEATURES), F.col(quoted(lcol)).cast("float").alias(Staged.LABEL)]
        if wcol:
            cols.append(F.col(quoted(wcol)).cast("float").alias(Staged.WEIGHT))
        frac, vcol = self.validation_share(), self.getOrDefault(self.validationCol)
        if vcol:
            cols.append(F.coalesce(F.col(quoted(vcol)), F.lit(False)).alias(Staged.IS_VALIDATION))
        rid = self.getOrDefault(self.rowIdCol)
        if frac and rid:
            cols.append(F.col(quoted(rid)).alias(_ROW_ID))
        staged = dataset.select(*cols)
        if frac and not vcol:
            # Each row on its own side, identical rows too: by its id, or by its content and
            # its place among identical rows. A hash of the content alone would put every copy
            # of a repeated row on one side (whole combinations never trained on).
            drawn = with_row_draw(staged, _DRAW, self.getOrDefault(self.seed), [_ROW_ID] if rid else (),
                                  purpose="validation")
            staged = drawn.select(*[c for c in staged.columns if c != _ROW_ID],
                                  (F.col(_DRAW) < frac).alias(Staged.IS_VALIDATION))
        return staged, bool(vcol or frac)

    def _checked_rows(self, staged: DataFrame) -> tuple[DataFrame, dict, int]:
        """One pass on the driver's orders, before any shard is written or rank started:
        vector lengths, unusable rows (raised or skipped, counted), the label range the task
        needs, and enough rows and batches for every rank."""
        fcol, lcol, wcol = self.getFeaturesCol(), self.getLabelCol(), self._weight_col()
        num_proc = self.getNumProc()
        checked = check_training_rows(staged, fcol, wcol)
        staged, skipped = apply_handle_invalid(staged, checked, self.getHandleInvalid(), fcol, lcol, wcol)
        usable = checked["rows"] - skipped
        if usable < num_proc:
            raise ValueError(f"DistributedKerasEstimator: {usable} usable training row(s) for numProc={num_proc}: every "
                             "rank needs rows of its own; lower numProc")
        accum = self.getOrDefault(self.accumulationSteps)
        per_rank_batches = math.ceil(usable * (1.0 - self.validation_share()) / num_proc / self.getBatchSize())
        if per_rank_batches < accum:
            raise ValueError(f"accumulationSteps={accum} needs {accum} batches per epoch on every rank, but "
                             f"{usable} rows over numProc={num_proc} ranks make about {per_rank_batches} batch(es) "
                             f"of {self.getBatchSize()} each: lower accumulationSteps or batchSize")
        return staged, checked, skipped

    def _finished_run(self, resume: dict, input_dim: int, skipped: int) -> "DistributedKerasModel | None":
        """The checkpoint's model when its run is finished (stopped early, or ran the epochs
        asked for now); None when it resumes."""
        stopped = bool((resume.get("stopping") or {}).get("stopped"))
        if not (stopped or resume["completed_epochs"] >= self.getEpochs()):
            return None
        ended = f"stopped early after {resume['completed_epochs']} epochs" if stopped else \
            f"completed {resume['completed_epochs']} epochs"
        log.info("[train] run %r already %s: loading its checkpoint", self.getOrDefault(self.runId), ended)
        strategy = self.getOrDefault(self.strategy)
        return self._model(resume["model_bytes"], {
            "history": resume["history"], "stopped_early": stopped,
            "resumed_from_epoch": resume["completed_epochs"], "ranks": [], "timings_s": {},
            "skipped_rows": skipped, "task": self.getTask(), "input_dim": input_dim,
            # the strategy asked for now (the checkpoint's weights are valid under any of them)
            "strategy": strategy,
            "local_steps": self.getOrDefault(self.localSteps) if strategy_takes(strategy, "local_steps") else None})

    def _rank_spec(self, model_bytes: bytes, has_validation: bool, folder: str | None,
                   resume: dict | None) -> RankSpec:
        """What every rank is told: the network, the task, the schedule and the strategy."""
        num_proc = self.getNumProc()
        return RankSpec(
            model_bytes=model_bytes, task=self.getTask(), loss=self.getOrDefault(self.loss).lower(),
            optimizer=self.getOrDefault(self.optimizer), learning_rate=self.getLearningRate(),
            scale_lr=self.getOrDefault(self.scaleLearningRate), warmup_epochs=self.getOrDefault(self.warmupEpochs),
            lr_schedule=self.getOrDefault(self.lrSchedule), epochs=self.getEpochs(),
            schedule_epochs=self.getScheduleEpochs(), batch_size=self.getBatchSize(),
            accumulation_steps=self.getOrDefault(self.accumulationSteps),
            compression=self.getOrDefault(self.compression), metrics=tuple(self.getOrDefault(self.metrics)),
            early_stopping_patience=self.getOrDefault(self.earlyStoppingPatience), seed=self.getOrDefault(self.seed),
            threads=max(1, (os.cpu_count() or 1) // num_proc), has_weight=bool(self._weight_col()),
            has_validation=has_validation,
            shuffle_buffer_rows=self.getOrDefault(self.shuffleBufferRows), strategy=self.getOrDefault(self.strategy),
            local_steps=self.getOrDefault(self.localSteps), measure_wait=self.getOrDefault(self.measureWait),
            shard_embeddings_above=self.getOrDefault(self.shardEmbeddingsAbove), checkpoint_dir=folder, resume=resume, trace_dir=self.getOrDefault(self.traceDir) or None,
            trace_epoch=self.getOrDefault(self.traceEpoch) if self.getOrDefault(self.traceDir) else 0)

    def _model(self, keras_bytes: bytes, summary: dict) -> "DistributedKerasModel":
        model = DistributedKerasModel(kerasBytes=keras_bytes, trainingSummary=summary)
        self._copyValues(model)
        model._set(task=self.getTask())
        return model


def _trained_network(results: list, model_bytes: bytes, spec: RankSpec) -> bytes:
    """Rank 0's trained network, or, where the ranks split tables, the network they started
    from (``model_bytes``) with every rank's trained rows put back together."""
    if results[0].model_bytes is not None:
        return results[0].model_bytes
    from .sharding import assemble
    return assemble(model_bytes, [r.split_weights for r in results], spec.shard_embeddings_above)


def _summary(results: list, spec: RankSpec, resume: dict | None, *, input_dim: int, skipped: int,
             times: tuple[float, float, float]) -> dict:
    """The fitted model's ``trainingSummary`` from every rank's result."""
    t_launch, t_staged, t_done = times
    chief = results[0]
    first_step = min(r.timings.first_step for r in results)
    train_start = min(r.timings.train_start for r in results)
    last_step = max(r.timings.end for r in results)
    return {
        "history": chief.history,
        "ranks": [r.report() for r in results],
        "strategy": spec.strategy,
        "local_steps": spec.local_steps if strategy_takes(spec.strategy, "local_steps") else None,
        "staleness": chief.staleness,
        "profile": profile_summary(results),
        "steps_per_epoch": chief.steps_per_epoch,
        "updates_per_epoch": chief.updates_per_epoch,
        "stopped_early": chief.stopped_early,
        # Rows no rank used in an epoch (larger shards beyond the smallest's step count).
        "trimmed_rows_per_epoch": sum(r.trimmed_per_epoch for r in results),
        "shuffle_buffer_rows": spec.shuffle_buffer_rows,
        "resumed_from_epoch": resume["completed_epochs"] if resume else 0,
        "input_dim": input_dim,
        "task": spec.task,
        "skipped_rows": skipped,
        "timings_s": {
            "checks": round(t_staged - t_launch, 3),
            "launch_to_first_step": round(first_step - t_launch, 3),
            "training": round(last_step - train_start, 3),
            # Rank 0's time handing each epoch's checkpoint to the driver (inside "training").
            "checkpoints": chief.timings.checkpoints,
            "fit_total": round(t_done - t_launch, 3),
            # After the last step: results and the model back to the driver, processes and stage ended.
            "teardown": round(t_done - last_step, 3),
        },
        # Where the launch went, part by part (transformers/keras/profile.LAUNCH_PARTS).
        "launch_s": launch_breakdown(t_launch, t_staged, [
            {**r.timings.launch, "first_step": r.timings.first_step} if r.timings.launch else None
            for r in results]),
    }


#: The estimator's name before it was named for every strategy (it trained with Horovod only).
KerasHorovodEstimator = DistributedKerasEstimator
