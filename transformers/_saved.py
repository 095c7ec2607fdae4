"""The classes of ``sparkdeep.transformers`` a saved model folder may name.

This package registers them with :mod:`sparkdeep.model_store`'s allow-list through the
``sparkdeep.saved_classes`` entry point (``pyproject.toml``), so the core names no stage
of ours. Plain strings in a module that imports nothing: reading them runs no stage code,
and they reach the driver from an installed wheel and from the ``--py-files`` zip alike
(the zip is the wheel, metadata included).
"""

#: module -> the classes in it that may be loaded, as MLlib's metadata writes them.
SAVED_CLASSES: dict[str, str] = {
    "sparkdeep.transformers.sampling": "UniformSampler UniformSamplerModel StratifiedSampler StratifiedSamplerModel "
                                       "ClassBalanceSampler ClassBalanceSamplerModel SamplingPipeline",
    "sparkdeep.transformers.selection": "SelectorModel VarianceSelector VarianceSelectorModel MissingRateSelector "
                                        "MissingRateSelectorModel UnivariateSelector UnivariateSelectorModel "
                                        "CorrelationSelector CorrelationSelectorModel ModelImportanceSelector "
                                        "ModelImportanceSelectorModel",
    "sparkdeep.transformers.pca": "CenteredPCA CenteredPCAModel",
    "sparkdeep.transformers.columns": "ColumnRenamer WideAssembler",
    "sparkdeep.transformers.quantiles": "MedianImputer QuantileBinner",
    "sparkdeep.transformers.hashing": "HashIndexer",
    # the network's stage, and its name before it was named for every strategy (saved models name it)
    "sparkdeep.transformers.keras.model": "DistributedKerasModel KerasHorovodModel",
    # the path before the ``keras`` package split, which saved models name
    "sparkdeep.transformers.keras_estimator": "KerasHorovodModel",
}
