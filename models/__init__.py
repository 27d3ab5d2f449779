"""Bayesian dropout networks trained with the BB-α loss, MC inference and uncertainty measures.

Subpackages, in the direction data flows: :mod:`.data` (MNIST, download) → :mod:`.networks`
(dropout MLP/CNN, presets; :mod:`.networks.bbb` Bayes by Backprop) → :mod:`.training` (BB-α
training, evaluation) → :mod:`.store` (safetensors + card + calibration) → :mod:`.mc` (MC engine,
losses, uncertainty). :mod:`.uci` is BB-α regression on the UCI benchmarks. MC outputs are always
shaped ``B×K×C`` (batch, MC sample, class).
"""
