"""Check the MNIST numbers of README.md and docs/models.md against their committed raw outputs.

Every row of the "MNIST test results" table in docs/models.md must have a raw output
``docs/mnist/<model>.json`` (what ``bayesgate evaluate MODEL --k 100 --seed 0 --json …`` wrote:
metrics, the exact command, the model card's training settings); the table's α, K train,
epochs, accuracy (%, 2 decimals), test LL, Brier and ECE (4 decimals) and training minutes must be
those of the file,
and so must the README's headline ("CNN α=0.5: **xx.xx %**, test LL −0.0xx") and the accuracy
column of the bundled-model candidates table. Nothing is evaluated: this reads files only.

    python bench/check_readme_numbers.py            # exit 1 and a list of mismatches, if any
    python bench/check_readme_numbers.py --render   # the table rows the raw outputs give
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS_TABLE = "## MNIST test results"
HEADLINE = re.compile(r"CNN α=0\.5: \*\*(?P<acc>[\d.]+) %\*\*, test LL (?P<ll>[−-][\d.]+)")
CANDIDATE = re.compile(r"^\| cnn α=0\.5 \| (?P<acc>[\d.]+) % \|", re.MULTILINE)
BUNDLED = "cnn-alpha0.5"
COLUMNS = ("α", "K train", "epochs", "accuracy", "log_likelihood", "brier", "ece", "train min")


def load_results(folder: Path) -> dict[str, dict]:
    """``{model name: raw output}`` for every ``*.json`` in ``folder``."""
    return {path.stem: json.loads(path.read_text()) for path in sorted(folder.glob("*.json"))}


def number(cell: str) -> float:
    """A table cell as a float: bold markers and the typographic minus removed."""
    return float(cell.replace("*", "").replace("−", "-").strip())


def table_rows(markdown: str, heading: str) -> list[list[str]]:
    """Cells of the data rows of the first table after ``heading``."""
    section = markdown.split(heading, 1)[1]
    rows = []
    for line in section.splitlines()[1:]:
        if not line.startswith("|"):
            if rows:
                break
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not set("".join(cells)) <= set("-: "):
            rows.append(cells)
    return rows[1:]  # without the header row


def expected_row(result: dict) -> dict[str, str]:
    """The table's cells as the raw output gives them (formatting as in docs/models.md)."""
    training = result["training"]
    return {
        "α": f"{training['alpha']:g}" if result.get("stochastic", True) else "–",
        "K train": str(training["k_train"]),
        "epochs": str(training["epochs_run"]),
        "accuracy": f"{100 * result['accuracy']:.2f}",
        "log_likelihood": f"{result['log_likelihood']:.4f}",
        "brier": f"{result['brier']:.4f}",
        "ece": f"{result['ece']:.4f}",
        "train min": f"{training['seconds'] / 60:.0f}",
    }


def check_table(markdown: str, results: dict[str, dict]) -> list[str]:
    """Mismatches between the docs/models.md results table and the raw outputs."""
    problems = []
    for cells in table_rows(markdown, RESULTS_TABLE):
        name = cells[0].replace("*", "").split(" ")[0]
        if name not in results:
            problems.append(f"docs/models.md: {name} has no raw output docs/mnist/{name}.json")
            continue
        want = expected_row(results[name])
        got = dict(zip(COLUMNS, cells[1:9], strict=True))
        for key, value in want.items():
            exact = key in ("α", "K train", "epochs", "train min")
            same = got[key] == value if exact else number(got[key]) == float(value)
            if not same:
                problems.append(f"docs/models.md: {name} {key} is {got[key]}, raw output {value}")
    return problems


def check_headlines(readme: str, models_md: str, results: dict[str, dict]) -> list[str]:
    """README's CNN headline and the candidates table's CNN accuracy against the raw output."""
    if BUNDLED not in results:
        return [f"no raw output docs/mnist/{BUNDLED}.json for the bundled model"]
    want = results[BUNDLED]
    acc, ll = f"{100 * want['accuracy']:.2f}", f"{want['log_likelihood']:.3f}"
    problems = []
    headline = HEADLINE.search(readme)
    if headline is None:
        problems.append("README.md: the CNN headline (CNN α=0.5: **… %**, test LL …) is missing")
    elif (headline["acc"], number(headline["ll"])) != (acc, float(ll)):
        problems.append(
            f"README.md: headline {headline['acc']} % / {headline['ll']}, raw output {acc} % / {ll}"
        )
    candidate = CANDIDATE.search(models_md)
    if candidate is not None and candidate["acc"] != acc:
        problems.append(f"docs/models.md: candidates table cnn {candidate['acc']} %, raw {acc} %")
    return problems


def render(results: dict[str, dict]) -> str:
    """Table rows (name through ECE) as the raw outputs give them."""
    lines = []
    for name, result in results.items():
        row = expected_row(result)
        ll = row["log_likelihood"].replace("-", "−")
        lines.append(
            f"| {name} | {row['α']} | {row['K train']} | {row['epochs']} | {row['accuracy']} "
            f"| {ll} | {row['brier']} | {row['ece']} | {row['train min']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="repository root")
    parser.add_argument("--render", action="store_true", help="print the rows, check nothing")
    args = parser.parse_args(argv)
    results = load_results(args.root / "docs" / "mnist")
    if args.render:
        print(render(results))
        return 0
    readme = (args.root / "README.md").read_text()
    models_md = (args.root / "docs" / "models.md").read_text()
    problems = check_table(models_md, results) + check_headlines(readme, models_md, results)
    for problem in problems:
        print(problem, file=sys.stderr)
    if not problems:
        print(f"README.md and docs/models.md agree with {len(results)} raw output(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
