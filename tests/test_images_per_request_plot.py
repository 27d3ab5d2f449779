"""bench/images_per_request_plot.py: runs grouped by images per request, and a plot written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.bench_scripts import load_bench

plot = load_bench("images_per_request_plot")


def run(path: Path, n: int | None, outside: float) -> Path:
    row = {"mode": "/v2 binary", "cpu_ms_per_request": outside + 0.7,
           "cpu_ms_outside_model": outside, "cpu_ms_loop": outside / 2}  # fmt: skip
    if n is not None:
        row["images_per_request"] = n
    other = {**row, "mode": "engine B=16"}
    path.write_text(json.dumps({"rows": [other, row]}))
    return path


def test_runs_are_grouped_by_n_and_plotted(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    files = [run(tmp_path / "a.json", None, 0.6), run(tmp_path / "b.json", 1, 0.7),
             run(tmp_path / "c.json", 4, 0.05)]  # fmt: skip
    runs = plot.points(files, "/v2 binary")
    assert list(runs) == [1, 4]  # a run without the field is one image per request
    assert [r["cpu_ms_outside_model"] for r in runs[1]] == [0.6, 0.7]
    assert plot.main([*map(str, files), "--out", str(tmp_path / "fig")]) == 0
    assert (tmp_path / "fig.png").stat().st_size > 1000
    assert "N =   4: outside the model 0.05 ms" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="no '/v1 JSON' row"):
        plot.points(files, "/v1 JSON")
