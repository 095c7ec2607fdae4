"""spark-submit-able jobs: ingest, prepare, train, score, evaluate, pipeline."""
