"""sparkdeep: Spark data reduction and Horovod-on-Spark Keras training, one MLlib pipeline."""
__version__ = "0.1.0"
