"""Train: Keras on distributed ranks (train.strategy) + MLlib's usual models (on every feature); save both pipelines.

The network trains on the prepared (rebalanced, selected, projected) table; the baselines
on every row of the ingested training table through the prepare pipeline's encoding
front, every assembled feature: what a user would fit instead (``pipelines/baselines``).
"""
from __future__ import annotations

import sys

from sparkdeep.pipelines.train import train_step as step

from sparkdeep.jobs._common import main_for

main = main_for("train", __doc__, step)

if __name__ == "__main__":
    sys.exit(main())
