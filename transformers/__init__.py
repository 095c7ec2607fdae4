"""MLlib stages: samplers, selectors and the Horovod Keras estimator."""
