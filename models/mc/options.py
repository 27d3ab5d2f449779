"""What a caller chooses of the MC predictions, without torch: the uncertainty scores by name and
the range of the dropout masks' seeds.

Why a module of its own: ``bayesgate calibrate --score`` offers the scores, and ``bayesgate
predict --seed`` refuses a seed out of range, before anything is loaded; read from here, they do
not wait for torch (~3 s). The scores themselves are :data:`bayesgate.models.mc.uncertainty.SCORES`
(torch), checked to implement these names when that module is imported.
"""

SCORE_NAMES = ("predictive_entropy", "mutual_information", "variation_ratio")
"""The uncertainty scores a threshold can be set on, in the order they are reported."""
MAX_SEED = 2**63 - 1
"""The largest seed of the dropout masks a request or ``predict --seed`` may give: an int64, the
largest integer the service's JSON schemas declare."""
