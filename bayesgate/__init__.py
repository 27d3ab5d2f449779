"""BayesGate command line entry point (``bayesgate``); the library lives in models/attacks/service."""
