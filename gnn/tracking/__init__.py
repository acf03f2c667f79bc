"""MLflow: runs and what they log, the model registry and its champion policy, scoring, plots, the pyfunc
flavour, and the local cache of registered models."""
