"""The names of the files in a model directory, without torch.

The model itself (``model.safetensors`` and ``card.json``, :mod:`.directory`), the thresholds
``bayesgate calibrate`` sets (``calibration.json``, :mod:`.calibration`) with its report and plots
(:mod:`bayesgate.attacks.report`), and the detector ``bayesgate fit-detector`` fits
(:mod:`bayesgate.models.detection.store`).

Why a module of its own: commands look for these files, or remove them (``train --force``), before
they load anything; named here, those checks import no torch (~3 s), and each name is spelt once.
"""

WEIGHTS_FILE = "model.safetensors"
CARD_FILE = "card.json"
CALIBRATION_FILE = "calibration.json"
REPORT_FILE = "calibration.md"
ROC_FILE = "calibration_roc.png"
HIST_FILE = "calibration_hist.png"
DETECTOR_JSON = "detector.json"
DETECTOR_TENSORS = "detector.safetensors"
