"""``bench/answer_cost.py``: the counts and timings it reports, on the tiny model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.bench_scripts import load_bench


def test_it_times_the_answers_warm_and_after_each_flush(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = load_bench("answer_cost")
    out = tmp_path / "answer_cost.json"
    argv = ["--model-dir", str(tiny_model_dir), "--batches", "1,3", "--k", "2"]
    assert bench.main([*argv, "--seconds", "0.05", "--flush-mb", "1,2", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["batch"] for r in rows] == [1, 3]
    for r in rows:
        assert r["torch_calls"] > 0 and r["aten_ops"] >= r["torch_calls"] > 0
        assert r["ms_per_image"] > 0
        assert set(r["ms_per_image_after_flush"]) == {"1", "2"}
        assert all(v > 0 for v in r["ms_per_image_after_flush"].values())
    assert "after 1 MB" in capsys.readouterr().out


@pytest.mark.parametrize("flush", ["x", "0", "4,2000"])
def test_a_bad_flush_list_is_refused(flush: str, capsys: pytest.CaptureFixture[str]) -> None:
    bench = load_bench("answer_cost")
    with pytest.raises(SystemExit) as exit_:
        bench.main(["--flush-mb", flush])
    assert exit_.value.code == 2 and "--flush-mb" in capsys.readouterr().err
