"""How the predictor does on a source it never saw: leave-one-source-out runs (loso) and their report."""
