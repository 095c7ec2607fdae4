"""MLlib stages: samplers, selectors, PCA and the distributed Keras estimator (:mod:`.keras`)."""
