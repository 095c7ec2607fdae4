"""Library pipelines: data, reduction, training and evaluation built from stages."""
