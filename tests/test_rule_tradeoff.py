"""bench/rule_tradeoff.py: the points it plots are the committed detect-eval results' counts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.bench_scripts import load_bench

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "robustness"


def test_points_agree_with_the_confidence_script_and_the_docs(tmp_path: Path) -> None:
    tradeoff = load_bench("rule_tradeoff")
    served = json.loads((DOCS / "unseen" / "detect_eval.json").read_text())
    point = tradeoff.rule_point(served)
    # recounted from the raw rows: successes − round(flagged fraction × successes)
    evaded = {}
    for row in served["rows"]:
        if row["kind"] == "attack":
            n = row["successful"]
            evaded[row["set"]] = (n - round(row["scores"]["fused"]["tpr_at_threshold"] * n),
                                  row["eligible"])  # fmt: skip
    cw = next(v for k, v in evaded.items() if k.startswith("cw:"))
    linf = [v for k, v in evaded.items() if k.startswith(("fgs:", "targeted:", "pgd:"))]
    assert (point["cw_through_k"], point["cw_eligible"]) == cw == (4, 298)  # docs/robustness.md
    assert point["linf_through_k"] == sum(k for k, _ in linf) == 10
    assert point["linf_eligible"] == sum(n for _, n in linf) == 5 * 994
    assert point["rotated"] == pytest.approx(0.782)
    assert point["clean_fpr"] == pytest.approx(0.06)

    out = tmp_path / "tradeoff"
    rules = [f"(d)={DOCS / 'unseen'}", f"(i)={DOCS / 'fisher'}"]
    assert tradeoff.main(["--out", str(out), *rules]) == 0
    points = json.loads(out.with_suffix(".json").read_text())
    assert points["(i)"]["cw_through_k"] == 46 and points["(i)"]["rotated"] == pytest.approx(0.929)
    assert out.with_suffix(".png").stat().st_size > 10_000
    with pytest.raises(SystemExit):
        tradeoff.main(["--out", str(out), "no-equals-sign"])
    with pytest.raises(SystemExit):
        tradeoff.main(["--out", str(out), f"(x)={tmp_path / 'no-such-folder'}"])
