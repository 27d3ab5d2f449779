"""The names of the out-of-distribution sets (:mod:`bayesgate.attacks.ood`), without torch.

:data:`DEFAULT_OOD` is what ``detect-eval`` runs unless told otherwise; :data:`FRESH_OOD` the sets
added after the detector's rule was fixed (opt-in, ``detect-eval --ood``). Why a module of its own:
``detect-eval`` offers and checks these names before anything is loaded; read from here, its
``--help`` and its refusals do not wait for torch (~3 s). The sets themselves
(:data:`bayesgate.attacks.ood.OOD_SETS`, torch) are checked to implement these names when that
module is imported.
"""

DEFAULT_OOD = ("uniform", "gaussian", "rotated", "inverted")
FRESH_OOD = ("rotated45", "rotated180", "shifted", "blurred", "letters")
OOD_NAMES = DEFAULT_OOD + FRESH_OOD
"""Every OOD set, in the order they are listed."""
