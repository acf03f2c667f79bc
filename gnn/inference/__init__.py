"""The batched prediction path every consumer takes: BatchPredictor and its featurisation workers."""
