"""Networks: the dropout MLP and CNN with their presets (:mod:`.dropout`) and the
Bayes-by-Backprop CNNs (:mod:`.bbb`)."""
