"""Tune: search the network's and XGBoost's settings with Optuna, then train with the best, as the train step.

The train step of the run with ``tune.trials`` > 0 required (``--trials N`` sets it): a
search of N trials for the network (TPE, pruned from each epoch's validation metric) and
N for the XGBoost baseline (``pipelines/tune``), each trial an MLflow child run; then the
best trial's network and the tuned baselines are saved as the run's models, as ``train``
saves them. A killed search resumes when the run id is rerun: finished trials are kept,
the one it was running trains again from its checkpoint.
"""
from __future__ import annotations

import sys

from sparkdeep.config import Config, ConfigError
from sparkdeep.jobs._common import execute, parser
from sparkdeep.pipelines.train import train_step

#: The run step a search belongs to: a tuned run's later steps read its models as any run's.
STEP = "train"


def require_trials(cfg: Config) -> None:
    """Refuse a config that asks for no search (``tune.trials`` < 1): the train job is for that.

    Raises
    ------
    ConfigError
        ``tune.trials`` is below 1.
    """
    if cfg.tune.trials < 1:
        raise ConfigError(f"config key 'tune.trials': value {cfg.tune.trials} means no search, and this job searches: "
                          "pass --trials N (or --set tune.trials=N) with N >= 1; the train job trains without one")


def main(argv: list[str] | None = None) -> int:
    """``python -m sparkdeep.jobs.tune --trials N [options]``: the run's train step with a
    search first; returns the exit status."""
    p = parser("tune", __doc__)
    p.add_argument("--trials", type=int, default=None, metavar="N",
                   help="trials per search, the network's and XGBoost's (the same as --set tune.trials=N; "
                        "default: config tune.trials, which must then be >= 1)")
    args = p.parse_args(argv)
    if args.trials is not None:
        args.overrides.append(f"tune.trials={args.trials}")
    return execute([STEP], {STEP: train_step}, args, app_name="sparkdeep-tune", require=require_trials)


if __name__ == "__main__":
    sys.exit(main())
