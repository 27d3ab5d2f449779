"""``calibrate --no-report`` runs without matplotlib (the report's import is lazy), so the
``attacks`` extra is not needed for a calibration with attacks of our own."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from bayesgate.cli import main


def test_calibrate_no_report_runs_without_matplotlib(
    model_copy: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("bayesgate.attacks.report", "bayesgate.attacks.plots"):
        monkeypatch.delitem(sys.modules, name, raising=False)  # imported afresh if at all
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib…` fails
    argv = ["calibrate", str(model_copy), "--no-report", "--attacks", "apgd:steps=2",
            "--val-limit", "50", "--test-limit", "10", "--k", "2", "--k-attack", "2",
            "--no-progress", "--device", "cpu"]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    summary = json.loads(capsys.readouterr().out)
    assert "report" not in summary and Path(summary["calibration"]).is_file()
    assert "bayesgate.attacks.report" not in sys.modules
