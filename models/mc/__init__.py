"""The MC engine: the dropout layer, K vectorised stochastic passes (``B×K×C``), the BB-α losses
and the uncertainty measures computed from the samples."""
