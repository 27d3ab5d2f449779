"""BB-α regression on the UCI benchmarks (Li & Gal 2017, Tables 1–2): data and splits, the grouped
dropout network trained for every hyper-parameter at once, the experiment and its command."""
