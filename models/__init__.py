"""Bayesian dropout networks trained with the BB-α loss, MC inference and uncertainty measures.

Data flows one way: ``data`` → ``networks`` → ``losses``/``train`` → ``store`` → ``mc`` →
``uncertainty``. MC outputs are always shaped ``B×K×C`` (batch, MC sample, class).
"""
