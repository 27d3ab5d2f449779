"""BayesGate's command line (``bayesgate``); the library lives in models/, attacks/, service/."""
