"""Where the Keras estimator and model lived before the ``keras`` package.

Models saved by earlier versions name ``sparkdeep.transformers.keras_estimator.KerasHorovodModel``
in their metadata; MLlib imports that path to load them, so it stays importable (and
allowed by :data:`sparkdeep.model_store.ALLOWED_CLASSES`). New code imports
:class:`~sparkdeep.transformers.keras.estimator.DistributedKerasEstimator` and
:class:`~sparkdeep.transformers.keras.model.DistributedKerasModel` from
:mod:`sparkdeep.transformers.keras`'s modules.
"""
from __future__ import annotations

from .keras.estimator import DistributedKerasEstimator, KerasHorovodEstimator
from .keras.model import KERAS_FILE, DistributedKerasModel, KerasHorovodModel

__all__ = ["KERAS_FILE", "DistributedKerasEstimator", "DistributedKerasModel", "KerasHorovodEstimator",
           "KerasHorovodModel"]
