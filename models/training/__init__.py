"""Training with the BB-α energy and evaluation (accuracy, log-likelihood, NLL, Brier, ECE)."""
