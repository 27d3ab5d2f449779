"""bench/robust_merge.py: separate evaluate-robust runs become one table, only if comparable."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench_scripts import load_bench

SETTINGS = {"eps": [0.1, 0.3], "n": 10, "attacks": ["pgd"], "pgd_steps": 100, "restarts": 5,
            "apgd_steps": 100, "k_attack": 10, "k_eval": 100, "batch_size": 100,
            "seed": 0}  # fmt: skip


def _module():
    return load_bench("robust_merge")


def _run(name: str, worst: tuple[float, float], adaptive: dict | None) -> dict:
    rows = [
        {"eps": e, "robust_accuracy": {"PGD": w}, "robust_accuracy_worst_of": w}
        for e, w in zip(SETTINGS["eps"], worst, strict=True)
    ]
    model = {"name": name, "images": 10, "clean_accuracy": 1.0, "eps": rows, "adaptive": adaptive}
    return {"settings": dict(SETTINGS), "models": [model]}


def test_two_runs_make_one_table_and_different_settings_are_refused(tmp_path: Path) -> None:
    merge = _module()
    a = _run("plain", (0.6, 0.0), {"status": "ran", "by_eps": {"0.1": 0.1, "0.3": 1.0},
                                   "clean_fpr": 0.05})  # fmt: skip
    b = _run("robust", (0.9, 0.8), {"status": "ran", "by_eps": {"0.1": 0.0, "0.3": 0.05},
                                    "clean_fpr": 0.04})  # fmt: skip
    paths = []
    for name, run in (("a", a), ("b", b)):
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps(run))
    assert merge.main([*map(str, paths), "--out", str(tmp_path / "out")]) == 0
    table = (tmp_path / "out" / "robust.md").read_text().splitlines()
    rows = [line for line in table if line.startswith("| plain") or line.startswith("| robust")]
    assert rows[0].startswith("| plain | 0.1 | 10 | 100.0 % | 60.0 % | 60.0 % | 10.0 % | 5.0 %")
    assert rows[3].startswith("| robust | 0.3 | 10 | 100.0 % | 80.0 % | 80.0 % | 5.0 % | 4.0 %")
    assert (
        json.loads((tmp_path / "out" / "robust.json").read_text())["models"][1]["name"] == "robust"
    )
    assert (tmp_path / "out" / "robust.png").stat().st_size > 1000
    b["settings"]["n"] = 20
    paths[1].write_text(json.dumps(b))
    assert merge.main([*map(str, paths), "--out", str(tmp_path / "refused")]) == 2
    assert not (tmp_path / "refused").exists()


def _write(tmp_path: Path, name: str, run: dict) -> str:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(run))
    return str(path)


def test_a_model_in_two_inputs_is_refused_naming_it_and_both_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without the check the merged table would have two rows called ``robust``."""
    merge = _module()
    first = _write(tmp_path, "first", _run("robust", (0.9, 0.8), None))
    second = _write(tmp_path, "second", _run("robust", (0.9, 0.7), None))
    assert merge.main([first, second, "--out", str(tmp_path / "refused")]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("robust_merge: model 'robust' is in both ")
    assert f"{first} and {second}" in line
    assert not (tmp_path / "refused").exists()


def test_the_same_weights_under_two_names_are_refused() -> None:
    merge = _module()
    a, b = _run("robust", (0.9, 0.8), None), _run("robust-again", (0.9, 0.8), None)
    a["models"][0]["weights_sha256"] = b["models"][0]["weights_sha256"] = "ab" * 32
    with pytest.raises(ValueError, match=r"'robust' \(a\.json\) and 'robust-again' \(b\.json\)"):
        merge.merge([a, b], ["a.json", "b.json"])
    b["models"][0]["weights_sha256"] = "cd" * 32  # other weights, other name: two models
    assert [m["name"] for m in merge.merge([a, b])["models"]] == ["robust", "robust-again"]


def test_the_very_same_row_twice_is_kept_once() -> None:
    """The same run's file given twice (or a merged file with one of its inputs): one row each,
    where it first appears; the rows' key order does not matter."""
    merge = _module()
    a, b = _run("plain", (0.6, 0.0), None), _run("robust", (0.9, 0.8), None)
    reordered = {key: a["models"][0][key] for key in reversed(list(a["models"][0]))}
    both = {"settings": dict(SETTINGS), "models": [reordered, *b["models"]]}
    merged = merge.merge([a, both, a])
    assert [m["name"] for m in merged["models"]] == ["plain", "robust"]
    assert merged["models"][0] is a["models"][0]
