"""What the driver and the ranks agree on, typed: the staged columns a rank reads, the
:class:`RankSpec` the driver sends (plain values, the model as ``.keras`` bytes, no
pickled Keras objects) and the :class:`RankResult` each rank sends back."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from sparkdeep.registry import Choices, strategy_conflicts, strategy_rule


class Staged:
    """The columns of the frame the estimator stages for the ranks (and the feed reads)."""
    FEATURES = "features"          # array<float>, one network input row
    LABEL = "label"                # float
    WEIGHT = "weight"              # float, only with weightCol
    IS_VALIDATION = "is_validation"  # boolean, only with validation


@dataclass(frozen=True)
class RankSpec:
    """Everything a rank needs, typed, with no defaults of its own for a training setting:
    the estimator fills every field from its params (where the defaults live)."""
    model_bytes: bytes
    task: str
    loss: str
    optimizer: str
    learning_rate: float
    scale_lr: bool
    warmup_epochs: float
    lr_schedule: str
    epochs: int
    schedule_epochs: int  # what the learning-rate schedule spans (>= epochs: a fit may stop short of it)
    batch_size: int
    accumulation_steps: int
    compression: str
    metrics: tuple
    early_stopping_patience: int
    seed: int
    threads: int
    has_weight: bool
    has_validation: bool
    shuffle_buffer_rows: int
    strategy: str
    local_steps: int
    measure_wait: bool
    shard_embeddings_above: int  # bytes; a larger embedding table is split across the ranks (0 = none is)
    checkpoint_dir: str | None = None
    # Optional deep traces (not a training setting): TensorFlow's profiler over epoch
    # ``trace_epoch`` of each rank and Horovod's timeline, under ``trace_dir`` ('' = none).
    trace_dir: str | None = None
    trace_epoch: int = 0
    # A resumed run: completed_epochs, history, model_bytes, optimizer_bytes (rank 0's state).
    resume: dict | None = field(default=None)

    def __post_init__(self):
        for name in ("epochs", "batch_size", "accumulation_steps", "shuffle_buffer_rows", "threads", "local_steps"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"RankSpec.{name} must be >= 1, got {getattr(self, name)}")
        if int(self.shard_embeddings_above) < 0:
            raise ValueError(f"RankSpec.shard_embeddings_above must be >= 0, got {self.shard_embeddings_above}")
        if int(self.schedule_epochs) < int(self.epochs):
            raise ValueError(f"RankSpec.schedule_epochs must be >= epochs={self.epochs}, got {self.schedule_epochs}")
        if self.compression not in Choices.COMPRESSIONS or self.lr_schedule not in Choices.LR_SCHEDULES:
            raise ValueError(f"RankSpec: compression {self.compression!r} / lr_schedule {self.lr_schedule!r}")
        try:
            strategy_rule(self.strategy)
        except ValueError as exc:
            raise ValueError(f"RankSpec: {exc}") from None
        conflicts = strategy_conflicts(self.strategy, {
            "compression": self.compression, "accumulation_steps": self.accumulation_steps,
            "measure_wait": self.measure_wait, "shard_embeddings_above": self.shard_embeddings_above})
        if conflicts:
            raise ValueError("RankSpec: " + "; ".join(conflicts.values()))

    def describe(self) -> dict:
        """The spec without its bytes (for logs and reports)."""
        d = asdict(self)
        d.pop("model_bytes")
        if d["resume"]:
            d["resume"] = {k: v for k, v in d["resume"].items() if not k.endswith("_bytes")}
        return d


@dataclass(frozen=True)
class RankTimings:
    """Wall-clock instants (``time.time()``) of one rank, and its checkpoint seconds."""
    enter: float        # the rank's function started
    train_start: float  # the first epoch started
    first_step: float   # the first gradient was computed
    end: float          # the last epoch ended
    checkpoints: float  # seconds rank 0 spent handing checkpoints to the driver
    # The launch's instants on the way to the first step (task start, spilled, spawn,
    # process_start, enter, imported, joined, model_ready): :func:`.profile.launch_breakdown`.
    launch: dict | None = None


@dataclass(frozen=True)
class RankResult:
    """What one rank sends back; rank 0 adds the history and the trained network."""
    rank: int
    size: int
    strategy: str
    rows: int
    validation_rows: int
    rows_per_epoch: int
    trimmed_per_epoch: int
    rows_seen: list
    max_window_rows: int
    steps_per_epoch: int
    updates_per_epoch: int
    stopped_early: bool
    allreduce_calls: int       # exchanges of the strategy's per-update traffic
    allreduce_bytes: int       # payload bytes this rank handed to those exchanges
    devices: str | None        # the GPUs Spark gave the rank's task
    horovod_imported: bool     # whether Horovod was imported in the rank's process
    weights_digest: str        # equal on every rank when the replicas ended identical
    code_path: str             # where the rank imported sparkdeep from (a shipped archive on a cluster)
    os_threads: int            # the rank process's threads when training ended (-1: not on Linux)
    timings: RankTimings
    history: list | None = None
    model_bytes: bytes | None = None
    # Split tables: this rank's trained weights by index, for the driver to put the network
    # together (:func:`.sharding.assemble`; rank 0's model_bytes is then None).
    split_weights: dict | None = None
    staleness: dict | None = None  # parameter_server: other updates between a read and its write
    # Per epoch, this rank's own profile (:mod:`.profile`): the time split, CPU, FLOP/s, memory.
    profile: list | None = None
    flops_per_sample: int | None = None  # the network's estimated training FLOPs per sample
    # Each embedding table split across the ranks: its shape and what this rank held of it
    # (rows_held, bytes_held; :meth:`.sharding.RankShards.held`).
    sharded: list | None = None
    variable_bytes: int | None = None  # the rank's model and optimizer variables when training ended
    peak_rss_mb: float | None = None   # the rank process's peak resident memory, its trained network saved
    # Resident memory at points of the rank's life: {point: [rss_mb, peak_rss_mb so far]}.
    memory: dict | None = None

    def report(self) -> dict:
        """The rank's entry in ``trainingSummary['ranks']`` (JSON-clean, no bytes)."""
        keys = ("rank", "rows", "validation_rows", "rows_per_epoch", "trimmed_per_epoch", "rows_seen",
                "max_window_rows", "weights_digest", "allreduce_calls", "allreduce_bytes", "devices", "code_path",
                "horovod_imported", "os_threads", "sharded", "variable_bytes", "peak_rss_mb", "memory")
        return {k: getattr(self, k) for k in keys}
