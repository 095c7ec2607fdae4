"""The train half of the quality gate on a real Keras network."""
import numpy as np
import pytest

from sparkdeep.pipelines.evaluate import QualityGateError
from sparkdeep.pipelines.train import check_finite
from sparkdeep.transformers import _rank_training
from sparkdeep.transformers.keras_estimator import KerasHorovodModel
from sparkdeep.transformers.keras_models import mlp_binary_classifier


def test_a_network_with_nan_weights_fails_the_gate():
    # Issue 11.5: training with an infinite learning rate gave NaN weights, saved and served.
    net = mlp_binary_classifier(4, hidden_units=[3], dropout=0.0)
    history = [{"epoch": 1, "loss": 0.69, "auc": 0.5}]
    check_finite(KerasHorovodModel(kerasBytes=_rank_training.keras_to_bytes(net),
                                   trainingSummary={"history": history}))
    weights = net.get_weights()
    weights[0] = np.full_like(weights[0], np.nan)
    net.set_weights(weights)
    nan_model = KerasHorovodModel(kerasBytes=_rank_training.keras_to_bytes(net), trainingSummary={"history": history})
    with pytest.raises(QualityGateError, match=r"weights not finite: .*kernel \(12 of 12 values\)"):
        check_finite(nan_model)
