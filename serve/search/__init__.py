"""Plan search through the surrogate: the plan space, the Optuna study, its report and plots, and its CLI."""
