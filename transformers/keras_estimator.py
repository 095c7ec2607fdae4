"""Where the Keras estimator and model lived before the ``keras`` package.

Models saved by earlier versions name ``sparkdeep.transformers.keras_estimator.KerasHorovodModel``
in their metadata; MLlib imports that path to load them, so it stays importable (and
allowed by :data:`sparkdeep.model_store.ALLOWED_CLASSES`). New code imports from
:mod:`sparkdeep.transformers.keras`'s modules.
"""
from __future__ import annotations

from .keras.estimator import KerasHorovodEstimator
from .keras.model import KERAS_FILE, KerasHorovodModel

__all__ = ["KERAS_FILE", "KerasHorovodEstimator", "KerasHorovodModel"]
