"""MNIST's splits: their names, and the sizes of the training set and of the validation split held
out of it, without torch.

Why a module of its own: ``bayesgate train`` shows the validation size (``--val-size``) in its
``--help``, which then answers without importing torch (~3 s); the reader (:mod:`.mnist`, torch)
imports them.
"""

TRAIN_SIZE = 60_000
DEFAULT_VAL_SIZE = 10_000
SPLITS = ("train", "val", "test", "train+val")
