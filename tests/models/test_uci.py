"""UCI regression: loader, standardisation, BB-α grouped training, test log-likelihood, CLI."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from bayesgate.cli import build_parser, main
from bayesgate.errors import InvalidArgument
from bayesgate.models.data.mnist import DataError
from bayesgate.models.mc.losses import alpha_energy, bbalpha_gaussian_loss
from bayesgate.models.uci import cli as uci_cli
from bayesgate.models.uci.config import UCIConfig
from bayesgate.models.uci.data import Standardiser, UCIDataError, available_datasets, load_uci
from bayesgate.models.uci.experiment import (
    grid_edge_counts,
    mean_and_se,
    paper_values,
    within_2se,
)
from bayesgate.models.uci.network import (
    GroupedDropoutNet,
    evaluate_members,
    gaussian_mc_log_likelihood,
    grouped_alpha_energy,
    grouped_bbalpha_loss,
    mc_forward,
    prior_weight_decay,
    train_members,
)

# --- a synthetic dataset folder in the UCI format ------------------------------------------


def write_folder(
    root: Path, name: str = "toy", n: int = 40, n_splits: int = 2, seed: int = 0
) -> tuple[Path, np.ndarray]:
    """``root/uci/name`` with 3 features, the target in column 1 (between features), index files
    written as floats, and test rows shifted by +100 so statistics over all rows would differ."""
    rng = np.random.default_rng(seed)
    folder = root / "uci" / name
    folder.mkdir(parents=True)
    data = rng.normal(size=(n, 4)) * [1.0, 2.0, 3.0, 0.5] + [5.0, -1.0, 0.0, 2.0]
    data[:, 1] = data[:, 0] - 0.5 * data[:, 2] + 0.1 * rng.normal(size=n)
    n_test = n // 5
    test_rows = {i: np.arange(i * n_test, (i + 1) * n_test) for i in range(n_splits)}
    data[test_rows[0]] += 100.0
    np.savetxt(folder / "data.txt", data)
    (folder / "index_features.txt").write_text("0.0\n2.0\n3.0\n")
    (folder / "index_target.txt").write_text("1.0\n")
    (folder / "n_splits.txt").write_text(f"{n_splits}\n")
    for i, test in test_rows.items():
        train = rng.permutation(np.setdiff1d(np.arange(n), test))
        np.savetxt(folder / f"index_train_{i}.txt", train, fmt="%.1f")
        np.savetxt(folder / f"index_test_{i}.txt", test, fmt="%.1f")
    (folder / "dropout_rates.txt").write_text("0.01\n0.1\n")
    (folder / "tau_values.txt").write_text("5.0\n")
    (folder / "n_hidden.txt").write_text("8\n")
    (folder / "n_epochs.txt").write_text("3\n")
    return folder, data


# --- loader ---------------------------------------------------------------------------------


def test_loader_reads_columns_and_splits(tmp_path: Path) -> None:
    folder, data = write_folder(tmp_path)
    ds = load_uci("toy", tmp_path)
    np.testing.assert_array_equal(ds.x, data[:, [0, 2, 3]])
    np.testing.assert_array_equal(ds.y, data[:, 1])
    assert ds.n_splits == 2
    assert ds.grid.dropout_rates == (0.01, 0.1) and ds.grid.tau_values == (5.0,)
    assert (ds.grid.n_hidden, ds.grid.n_epochs) == (8, 3)
    train, test = ds.split(1)
    np.testing.assert_array_equal(train, np.loadtxt(folder / "index_train_1.txt").astype(int))
    np.testing.assert_array_equal(test, np.arange(8, 16))
    assert train.dtype == np.int64 and len(set(train) | set(test)) == 40


def test_standardiser_uses_training_rows_only(tmp_path: Path) -> None:
    write_folder(tmp_path)
    ds = load_uci("toy", tmp_path)
    train, test = ds.split(0)
    s = Standardiser.fit(ds.x[train], ds.y[train])
    x_train, x_test = ds.x[train], ds.x[test]
    np.testing.assert_allclose(s.x_mean, x_train.mean(0))
    np.testing.assert_allclose(s.x_std, x_train.std(0))
    np.testing.assert_allclose(s.transform_x(x_train).mean(0), 0, atol=1e-12)
    np.testing.assert_allclose(s.transform_x(x_train).std(0), 1)
    # the shifted test rows are mapped with the training statistics: far from zero mean
    np.testing.assert_allclose(s.transform_x(x_test), (x_test - x_train.mean(0)) / x_train.std(0))
    assert s.transform_x(x_test).mean() > 10
    assert s.y_mean == pytest.approx(ds.y[train].mean()) and s.y_std == pytest.approx(
        ds.y[train].std()
    )
    np.testing.assert_allclose(s.inverse_y(s.transform_y(ds.y)), ds.y)


def test_standardiser_constant_feature_keeps_scale_one() -> None:
    x = np.array([[1.0, 3.0], [2.0, 3.0], [4.0, 3.0]])
    s = Standardiser.fit(x, np.array([0.0, 1.0, 5.0]))
    assert s.x_std[1] == 1.0
    np.testing.assert_allclose(s.transform_x(x)[:, 1], 0.0)
    with pytest.raises(ValueError, match="constant"):
        Standardiser.fit(x, np.ones(3))


def test_alias_and_unknown_name(tmp_path: Path) -> None:
    write_folder(tmp_path, name="wine-quality-red")
    write_folder(tmp_path, name="yacht")
    assert load_uci("wine", tmp_path).name == "wine-quality-red"
    assert available_datasets(tmp_path) == ["wine-quality-red", "yacht"]
    with pytest.raises(UCIDataError, match=r"unknown UCI dataset 'nope'.*wine-quality-red, yacht"):
        load_uci("nope", tmp_path)
    assert issubclass(UCIDataError, DataError)


@pytest.mark.parametrize(
    ("file", "content", "message"),
    [
        ("index_target.txt", None, r"index_target\.txt is missing"),
        ("index_features.txt", "0\n2.5\n", "whole numbers"),
        ("index_features.txt", "0\n7\n", r"out of range \[0, 4\)"),
        ("index_features.txt", "0\n0\n", "repeated column"),
        ("index_target.txt", "2\n", "also a feature"),
        ("index_test_1.txt", None, r"index_test_1\.txt is missing \(n_splits\.txt says 2"),
        ("data.txt", "1 2 x\n3 4 5\n", "not a whitespace-separated table"),
        ("n_splits.txt", "0\n", "one positive integer"),
        ("dropout_rates.txt", "0.5\n1.5\n", r"numbers in \(0, 1\)"),
    ],
)
def test_bad_files_give_clear_errors(
    tmp_path: Path, file: str, content: str | None, message: str
) -> None:
    folder, _ = write_folder(tmp_path)
    if content is None:
        (folder / file).unlink()
    else:
        (folder / file).write_text(content)
    with pytest.raises(UCIDataError, match=message):
        load_uci("toy", tmp_path)


def test_bad_split_files(tmp_path: Path) -> None:
    folder, _ = write_folder(tmp_path)
    (folder / "index_test_0.txt").write_text("0\n1\n40\n")
    (folder / "index_test_1.txt").write_text("8\n9\n")
    train = np.loadtxt(folder / "index_train_1.txt").astype(int)
    (folder / "index_train_1.txt").write_text("\n".join(map(str, [*train, 8])) + "\n")
    ds = load_uci("toy", tmp_path)
    with pytest.raises(UCIDataError, match=r"index_test_0\.txt: row index out of range"):
        ds.split(0)
    with pytest.raises(UCIDataError, match="in both train and test"):
        ds.split(1)
    with pytest.raises(UCIDataError, match="split 2 out of range"):
        ds.split(2)


# --- metrics --------------------------------------------------------------------------------


def brute_force_ll(samples: np.ndarray, y: float, tau: float) -> float:
    """log of the mean Gaussian density over samples, summed term by term in float64."""
    dens = [math.sqrt(tau / (2 * math.pi)) * math.exp(-0.5 * tau * (y - f) ** 2) for f in samples]
    return math.log(sum(dens) / len(dens))


def test_test_log_likelihood_matches_brute_force_with_unit_change() -> None:
    rng = np.random.default_rng(1)
    y_mean, y_std, tau = 20.0, 7.5, 0.08  # τ in original units
    f_std = rng.normal(size=(5, 30))  # standardised MC samples, B×K
    y = rng.normal(y_mean, y_std, size=5)
    f = f_std * y_std + y_mean
    got = gaussian_mc_log_likelihood(torch.tensor(f), torch.tensor(y), tau).numpy()
    want = [brute_force_ll(f[n], y[n], tau) for n in range(5)]
    np.testing.assert_allclose(got, want, rtol=1e-12)
    # the same value from standardised units: τ_n = τσ², minus log σ (Jacobian)
    standardised = gaussian_mc_log_likelihood(
        torch.tensor(f_std), torch.tensor((y - y_mean) / y_std), tau * y_std**2
    ).numpy()
    np.testing.assert_allclose(standardised - math.log(y_std), want, rtol=1e-12)


def test_evaluate_members_denormalises_and_scores_in_original_units() -> None:
    g = torch.Generator().manual_seed(3)
    net = GroupedDropoutNet(2, 6, [0.0, 0.2], generator=g)
    x = torch.randn(9, 2, generator=g)
    y = np.random.default_rng(2).normal(10.0, 4.0, size=9)
    y_mean, y_std, taus = 10.0, 4.0, [0.5, 0.05]
    got = evaluate_members(
        net,
        x,
        y,
        y_mean=y_mean,
        y_std=y_std,
        taus=taus,
        k=7,
        generator=torch.Generator().manual_seed(5),
    )
    with torch.no_grad():
        samples = mc_forward(net, x, 7, torch.Generator().manual_seed(5))[..., 0].double().numpy()
    f = samples * y_std + y_mean  # G×B×K in original units
    for m in range(2):
        ll = np.mean([brute_force_ll(f[m, n], y[n], taus[m]) for n in range(9)])
        rmse = math.sqrt(np.mean((f[m].mean(1) - y) ** 2))
        assert got["log_likelihood"][m] == pytest.approx(ll, rel=1e-9)
        assert got["rmse"][m] == pytest.approx(rmse, rel=1e-9)
    # p = 0: all K samples coincide with the plain forward, so LL is a single Gaussian
    w1, b1, w2, b2 = (t[0].detach().double() for t in (net.w1, net.b1, net.w2, net.b2))
    plain = (torch.relu(x.double() @ w1 + b1) @ w2 + b2).view(-1).numpy() * y_std + y_mean
    gauss = 0.5 * math.log(taus[0] / (2 * math.pi)) - 0.5 * taus[0] * (y - plain) ** 2
    assert got["log_likelihood"][0] == pytest.approx(gauss.mean(), rel=1e-5)


def test_mean_se_and_paper_comparison() -> None:
    mean, se = mean_and_se([1.0, 2.0, 4.0])
    assert mean == pytest.approx(7 / 3)
    assert se == pytest.approx(np.std([1.0, 2.0, 4.0], ddof=1) / math.sqrt(3))
    assert math.isnan(mean_and_se([1.0])[1])
    assert paper_values("bostonHousing", 0.5) == (2.38, 2.97, 0.06, 0.19)  # appendix D
    assert paper_values("yacht", 1.0) == (1.15, 0.88, 0.06, 0.06)
    assert paper_values("bostonHousing", 0.25) is None
    assert within_2se(2.50, 0.05, 2.42) is True and within_2se(2.60, 0.05, 2.42) is False
    # combined: 2·√(0.05² + 0.06²) + 0.005 = 0.161 ≥ 0.16, but 2·0.05 + 0.005 < 0.16
    assert (
        within_2se(2.58, 0.05, 2.42, 0.06) is True and within_2se(2.59, 0.05, 2.42, 0.06) is False
    )
    assert within_2se(2.5, math.nan, 2.42) is None


def test_table_names_a_runs_optimiser_when_it_is_not_the_default() -> None:
    """Concrete's 400-epoch run with Gal's recipe (lr 10⁻³, batch 32) must not read like a
    default-optimiser run of 400 epochs; default runs show their epochs alone."""
    from bayesgate.models.uci.cli import epochs_text

    assert epochs_text({"epochs": 1000, "lr": 1e-2, "batch_size": 128}) == "1000"
    assert epochs_text({"epochs": 300}) == "300"  # older summaries: the defaults
    assert epochs_text({"epochs": 400, "lr": 1e-3, "batch_size": 32}) == "400 (lr 0.001, batch 32)"


def test_table_marks_better_than_the_paper_apart_from_worse() -> None:
    """Boston α = 0.5 in the paper: NLL 2.38 ± 0.06, RMSE 2.97 ± 0.19 (2-SE bands ±0.17/±0.54
    with our SE 0.06/0.19). Lower beyond the band is "better", higher is ✗."""
    from bayesgate.models.uci.cli import format_table
    from bayesgate.models.uci.experiment import compare_with_paper

    def row(nll: float, rmse: float) -> str:
        entry = {"dataset": "bostonHousing", "alpha": 0.5, "splits": 20, "test_nll": nll,
                 "test_nll_se": 0.06, "test_rmse": rmse, "test_rmse_se": 0.19}  # fmt: skip
        cells = [c.strip() for c in format_table([compare_with_paper(entry)]).splitlines()[2]
                 .strip("|").split("|")]  # fmt: skip
        return f"{cells[7]} {cells[10]}"

    assert row(2.40, 3.00) == "✓ ✓"
    assert row(2.10, 2.30) == "better better"
    assert row(2.70, 3.60) == "✗ ✗"
    assert row(2.56, 2.42) == "✗ better"  # 2.38 + 0.175 = 2.555 < 2.56; 2.97 − 0.542 > 2.42


def test_one_split_shows_no_standard_error_rather_than_nan() -> None:
    """One split has no standard error (NaN): the table shows ``± –``, not ``± nan``."""
    from bayesgate.models.uci.cli import format_table

    nan = float("nan")
    entry = {"dataset": "yacht", "alpha": 0.5, "splits": 1, "test_nll": 1.234,
             "test_nll_se": nan, "test_rmse": 0.876, "test_rmse_se": nan}  # fmt: skip
    line = format_table([entry]).splitlines()[2]
    assert "1.23 ± –" in line and "0.88 ± –" in line and "nan" not in line


def test_grid_edge_counts() -> None:
    settings = {"dropout_rates": [0.005, 0.01, 0.05], "tau_values": [0.1, 0.5, 1.0]}
    rows = [
        {"dropout": 0.01, "tau": 0.5},  # inside both grids
        {"dropout": 0.005, "tau": 0.5},  # p at the low edge
        {"dropout": 0.05, "tau": 1.0},  # both at the high edge: one row at an edge
        {"dropout": 0.01, "tau": 0.1},
    ]
    assert grid_edge_counts(rows, settings) == {
        "choices": 4,
        "dropout": {"low": 1, "high": 1},
        "tau": {"low": 1, "high": 1},
        "at_an_edge": 3,
    }
    learned = {"dropout_rates": [0.005, 0.01, 0.05], "tau_values": []}
    rows_learned = [{"dropout": 0.01, "tau": 123.4}, {"dropout": 0.01, "tau": 0.5}]
    assert grid_edge_counts(rows_learned, learned) == {
        "choices": 2,
        "dropout": {"low": 0, "high": 0},
        "at_an_edge": 0,
    }


# --- model and loss -------------------------------------------------------------------------


def test_grouped_loss_equals_bbalpha_gaussian_loss_per_member() -> None:
    gen = torch.Generator().manual_seed(0)
    pred = torch.randn(5, 7, 4, 1, generator=gen, dtype=torch.float64)
    y = torch.randn(7, 1, generator=gen, dtype=torch.float64)
    alphas = torch.tensor([0.0, 0.5, 1.0, 2.0, 0.0], dtype=torch.float64)
    taus = torch.tensor([1.0, 2.0, 3.0, 0.5, 7.0], dtype=torch.float64)
    got = grouped_bbalpha_loss(pred, y, alphas, taus)
    for m in range(5):
        want = bbalpha_gaussian_loss(pred[m], y, float(alphas[m]), float(taus[m]))
        assert float(got[m]) == pytest.approx(float(want), rel=1e-12)
    ll = torch.randn(3, 6, 5, generator=gen, dtype=torch.float64)
    energies = grouped_alpha_energy(ll, torch.tensor([0.0, 1.0, 0.3], dtype=torch.float64))
    for m, a in enumerate((0.0, 1.0, 0.3)):
        torch.testing.assert_close(energies[m], alpha_energy(ll[m], a))
    with pytest.raises(ValueError, match="alpha must be a finite number ≥ 0"):
        grouped_alpha_energy(ll, torch.tensor([0.0, -1.0, 0.3], dtype=torch.float64))


def test_learned_tau_loss_is_the_analytic_gaussian_negative_log_likelihood() -> None:
    """With p = 0 every pass is the same function, so for any α the energy is
    −log N(y; f, 1/τ) = (τ/2)(y−f)² − ½ log τ + ½ log 2π, with τ = exp(log_tau)."""
    gen = torch.Generator().manual_seed(0)
    net = GroupedDropoutNet(2, 5, [0.0, 0.0, 0.0], generator=gen)
    net.learn_tau(torch.tensor([0.5, 2.0, 30.0]))
    x, y = torch.randn(9, 2, generator=gen), torch.randn(9, 1, generator=gen)
    pred = mc_forward(net, x, 4, gen)
    got = grouped_bbalpha_loss(pred, y, torch.tensor([0.0, 0.5, 1.0]), net.log_tau.exp())
    for m, tau in enumerate((0.5, 2.0, 30.0)):
        f = pred[m, :, 0, 0].detach().double()
        want = (tau / 2 * (y[:, 0].double() - f) ** 2 - 0.5 * math.log(tau)
                + 0.5 * math.log(2 * math.pi)).mean()  # fmt: skip
        assert float(got[m].detach()) == pytest.approx(float(want), rel=1e-5)
    got.sum().backward()  # τ gets a gradient through the energy
    assert net.log_tau.grad is not None and bool((net.log_tau.grad != 0).all())
    assert torch.allclose(net.select([2]).learned_taus, torch.tensor([30.0]))


def test_learned_tau_converges_to_the_maximum_likelihood_precision() -> None:
    """Without dropout the energy's τ-optimum is 1/mean residual² (starting below it)."""
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(256, 3, generator=gen)
    y = x @ torch.tensor([1.0, -2.0, 0.5]) + 0.3 * torch.randn(256, generator=gen)
    net = GroupedDropoutNet(3, 16, [0.0, 0.0], generator=gen)
    starts = torch.tensor([0.05, 1.0])
    net.learn_tau(starts)
    train_members(net, x, y, alphas=torch.tensor([0.5, 1.0]), taus=starts,
                  weight_decay=torch.zeros(2), epochs=150, k=2, batch_size=64, lr=1e-2,
                  tau_lr=0.05, generator=gen)  # fmt: skip
    with torch.no_grad():
        residual = y - mc_forward(net, x, 1, gen)[:, :, 0, 0]  # G×N, no dropout
    mle = 1.0 / residual.pow(2).mean(dim=1)
    assert torch.allclose(net.learned_taus, mle, rtol=0.1), (net.learned_taus, mle)
    assert bool((mle > 8).all())  # far from both starts: noise std 0.3 ⇒ τ ≈ 11


def test_grouped_energy_is_accurate_in_float32_at_small_alpha() -> None:
    # members with α = 1e-8, 1e-6, 1e-4 and 0 against 40-digit sums (mpmath); the old
    # logsumexp − log K form was 100 %, 5 % and 0.07 % off in float32
    import mpmath

    gen = torch.Generator().manual_seed(3)
    ll = -torch.rand(4, 16, 10, generator=gen) * 20
    alphas = torch.tensor([1e-8, 1e-6, 1e-4, 0.0])
    got = grouped_alpha_energy(ll, alphas)
    assert got.dtype == torch.float32
    with mpmath.workdps(40):
        for g, alpha in enumerate(alphas.tolist()):
            for n, row in enumerate(ll[g].double().tolist()):
                if alpha == 0:
                    want = -mpmath.fsum(row) / len(row)
                else:
                    a = mpmath.mpf(alpha)
                    mean = mpmath.fsum(mpmath.exp(a * mpmath.mpf(v)) for v in row) / len(row)
                    want = -mpmath.log(mean) / a
                assert float(got[g, n]) == pytest.approx(float(want), rel=1e-5)


def test_dropout_rate_and_member_independence() -> None:
    gen = torch.Generator().manual_seed(0)
    net = GroupedDropoutNet(3, 4, [0.0, 0.3], generator=gen)
    ones = torch.ones(2, 50_000, 3)
    kept = net._mask(ones, gen)
    assert float(kept[0].mean()) == 1.0
    assert float(kept[1].mean()) == pytest.approx(0.7, abs=0.01)  # binomial SE ≈ 0.0012
    # member 1's loss has no gradient on member 0's weights
    out = mc_forward(net, torch.randn(5, 3, generator=gen), 3, gen)
    out[1].sum().backward()
    assert float(net.w1.grad[0].abs().sum()) == 0.0 and float(net.w1.grad[1].abs().sum()) > 0
    picked = net.select([1])
    assert picked.rates == [0.3]
    torch.testing.assert_close(picked.w1[0], net.w1[1])
    torch.testing.assert_close(
        prior_weight_decay([0.0, 0.3], 50, 0.1), torch.tensor([0.01 / 100, 0.01 * 0.7 / 100])
    )


def test_training_fits_a_sine() -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(300, 1, generator=gen) * 6 - 3
    y = torch.sin(x[:, 0]) + 0.1 * torch.randn(300, generator=gen)
    x_test = torch.linspace(-2.9, 2.9, 100).unsqueeze(1)
    y_test = torch.sin(x_test[:, 0]).double().numpy()
    y_mean, y_std = float(y.mean()), float(y.std(correction=0))
    x_mean, x_std = x.mean(), x.std(correction=0)
    net = GroupedDropoutNet(1, 50, [0.01, 0.01], generator=gen)
    tau = 100.0  # noise std 0.1 in original units
    train_members(
        net,
        (x - x_mean) / x_std,
        (y - y_mean) / y_std,
        alphas=torch.tensor([0.0, 0.5]),
        taus=torch.full((2,), tau * y_std**2),
        weight_decay=prior_weight_decay([0.01, 0.01], 300, 1e-2),
        epochs=100,
        batch_size=32,
        generator=gen,
    )
    got = evaluate_members(
        net, (x_test - x_mean) / x_std, y_test, y_mean=y_mean, y_std=y_std, taus=[tau, tau], k=50
    )
    assert y_std > 0.6
    assert np.all(got["rmse"] < 0.15 * y_std), got["rmse"]
    assert np.all(got["log_likelihood"] > 0.0), got["log_likelihood"]  # σ = 0.1 ⇒ log N up to 1.38


# --- CLI ------------------------------------------------------------------------------------


def test_cli_writes_results_and_summary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    write_folder(tmp_path / "data", name="toy", n=60)
    monkeypatch.setenv("BAYESGATE_DATA_DIR", str(tmp_path / "data"))
    out = tmp_path / "out"
    args = ["uci", "--dataset", "toy", "--alpha", "0", "0.5", "--splits", "2", "--k-test", "20"]
    assert main([*args, "--out", str(out), "--no-progress"]) == 0
    with open(out / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["split"], r["alpha"]) for r in rows] == [
        ("0", "0.0"),
        ("0", "0.5"),
        ("1", "0.0"),
        ("1", "0.5"),
    ]
    assert all(r["dropout"] in {"0.01", "0.1"} and r["tau"] == "5.0" for r in rows)
    assert {r["n_train"] for r in rows} == {"48"} and {r["n_test"] for r in rows} == {"12"}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["settings"]["epochs"] == 3 and summary["settings"]["hidden"] == 8
    for entry in summary["summary"]:
        nll = [float(r["test_nll"]) for r in rows if float(r["alpha"]) == entry["alpha"]]
        assert entry["splits"] == 2
        assert entry["test_nll"] == pytest.approx(np.mean(nll))
        assert entry["test_nll_se"] == pytest.approx(np.std(nll, ddof=1) / math.sqrt(2))
    assert "| toy | 0.5 | grid | 2 | 3 |" in capsys.readouterr().out
    assert summary["grid_edges"]["choices"] == 4 and "tau" not in summary["grid_edges"]  # 1 τ
    assert main(["uci-table", str(tmp_path / "out")]) == 0
    assert "| toy | 0 | grid | 2 | 3 |" in capsys.readouterr().out
    # --resume keeps the finished splits (same numbers) and refuses changed settings
    before = (out / "results.csv").read_text()
    assert main([*args, "--out", str(out), "--no-progress", "--resume"]) == 0
    assert (out / "results.csv").read_text() == before
    assert main([*args, "--out", str(out), "--resume", "--epochs", "1"]) == 2
    assert "holds results made with other settings (epochs: 3 → 1)" in capsys.readouterr().err


def _no_training(monkeypatch: pytest.MonkeyPatch) -> None:
    """``run_split`` fails the test: a refusal must come before any split's training."""

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("run_split called")

    monkeypatch.setattr("bayesgate.models.uci.experiment.run_split", never)


def test_cli_refuses_to_replace_results_of_other_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An --out holding results of other settings (or of another dataset) is refused before the
    work, in one line naming what differs, with or without --resume; --force replaces them."""
    write_folder(tmp_path / "data", name="toy", n=60)
    write_folder(tmp_path / "data", name="toy2", n=60)
    monkeypatch.setenv("BAYESGATE_DATA_DIR", str(tmp_path / "data"))
    out = tmp_path / "out"
    tiny = ["--splits", "1", "--epochs", "1", "--k-test", "5", "--k-val", "5", "--no-progress"]
    assert main(["uci", "--dataset", "toy", "--alpha", "0.5", *tiny, "--out", str(out)]) == 0
    before = {name: (out / name).read_text() for name in ("results.csv", "summary.json")}
    capsys.readouterr()
    with monkeypatch.context() as m:
        _no_training(m)
        other = ["uci", "--dataset", "toy", "--alpha", "0", *tiny, "--epochs", "2"]
        for extra, prefix in (([], ""), (["--resume"], "--resume: ")):
            assert main([*other, "--out", str(out), *extra]) == 2
            assert capsys.readouterr().err == (
                f"bayesgate: error: {prefix}--out {out} holds results made with other settings "
                "(alphas: [0.5] → [0.0], epochs: 1 → 2): choose another --out, or --force to "
                "replace them\n"
            )
        another_dataset = ["uci", "--dataset", "toy2", "--alpha", "0.5", *tiny]
        assert main([*another_dataset, "--out", str(out)]) == 2
        assert "(dataset: 'toy' → 'toy2')" in capsys.readouterr().err
    assert {name: (out / name).read_text() for name in before} == before
    assert main([*other, "--out", str(out), "--force"]) == 0
    err = capsys.readouterr().err
    assert f"uci: replacing the existing results.csv, summary.json in {out}\n" in err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["settings"]["alphas"] == [0.0] and summary["settings"]["epochs"] == 2


def test_cli_same_settings_replace_with_a_note_or_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Results of the same settings: a run without --resume replaces them, saying so first (as
    the other commands do); --resume keeps them. Settings an older summary.json does not name
    (learn_tau and the learned τ's, added later) are those it ran with: not a difference."""
    write_folder(tmp_path / "data", name="toy", n=60)
    monkeypatch.setenv("BAYESGATE_DATA_DIR", str(tmp_path / "data"))
    out = tmp_path / "out"
    args = ["uci", "--dataset", "toy", "--alpha", "0.5", "--splits", "1", "--epochs", "1",
            "--k-test", "5", "--k-val", "5", "--no-progress", "--out", str(out)]  # fmt: skip
    assert main(args) == 0
    assert "replacing" not in capsys.readouterr().err  # a fresh --out: as before
    assert main(args) == 0
    assert f"uci: replacing the existing results.csv, summary.json in {out}\n" in (
        capsys.readouterr().err
    )
    document = json.loads((out / "summary.json").read_text())
    for key in ("learn_tau", "tau_init", "tau_lr"):
        del document["settings"][key]
    (out / "summary.json").write_text(json.dumps(document))
    before = (out / "results.csv").read_text()
    with monkeypatch.context() as m:
        _no_training(m)
        assert main([*args, "--resume"]) == 0
    assert "replacing" not in capsys.readouterr().err
    assert (out / "results.csv").read_text() == before
    # results whose settings cannot be read are not thrown away either
    (out / "summary.json").write_text("{")
    with monkeypatch.context() as m:
        _no_training(m)
        assert main(args) == 2
        assert "holds results made with other settings (unknown: summary.json does not read" in (
            capsys.readouterr().err
        )
        (out / "summary.json").unlink()
        assert main([*args, "--resume"]) == 2
        assert "(unknown: no summary.json)" in capsys.readouterr().err
    assert (out / "results.csv").read_text() == before


@pytest.mark.parametrize(
    ("flags", "line"),
    [
        (
            ["--learn-tau", "--tau-values", "1"],
            "--tau-values does not apply with --learn-tau (got 1)",
        ),
        (["--tau-init", "2"], "--tau-init applies with --learn-tau only (got 2)"),
        (["--tau-lr", "0.5"], "--tau-lr applies with --learn-tau only (got 0.5)"),
    ],
)
def test_cli_refuses_tau_flags_that_do_not_apply(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    flags: list[str],
    line: str,
) -> None:
    """A τ grid with --learn-tau (recorded as ``tau_values: []``), or a learned τ's start or rate
    without it, is refused before the data is read rather than silently unused."""

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("load_uci called")

    monkeypatch.setattr("bayesgate.models.uci.data.load_uci", never)
    out = tmp_path / "out"
    assert main(["uci", "--dataset", "toy", "--out", str(out), *flags]) == 2
    assert capsys.readouterr().err == f"bayesgate: error: {line}\n"
    assert not out.exists()
    # their defaults stay accepted where they do not apply (what a recorded command names)
    argv = ["uci", "--dataset", "toy", "--tau-init", "1", "--tau-lr", "0.1"]
    assert uci_cli._uci_config(build_parser("uci").parse_args(argv)) == UCIConfig()


@pytest.mark.parametrize(
    ("settings", "line"),
    [
        (
            {"learn_tau": True, "tau_values": (1.0, 2.5)},
            "tau_values does not apply with learn_tau (got 1, 2.5)",
        ),
        ({"tau_init": 2.0}, "tau_init applies with learn_tau only (got 2)"),
        ({"tau_lr": 0.5}, "tau_lr applies with learn_tau only (got 0.5)"),
        ({"learn_tau": True, "tau_values": (-1.0,)}, "tau_values must be > 0, got -1"),
        ({"tau_lr": -0.1}, "tau_lr must be > 0, got -0.1"),  # a bad value: named as such
    ],
)
def test_config_refuses_tau_settings_that_do_not_apply(
    settings: dict[str, object], line: str
) -> None:
    """UCIConfig itself (not only ``bayesgate uci``) refuses a τ grid with learn_tau and a
    learned τ's start or rate without it, in one line, rather than dropping them."""
    with pytest.raises(InvalidArgument) as info:
        UCIConfig(**settings)  # type: ignore[arg-type]
    assert str(info.value) == line
    # a field at its default is not set; each applies where it does
    assert UCIConfig(tau_init=1.0, tau_lr=0.1, tau_values=None) == UCIConfig()
    assert UCIConfig(learn_tau=True, tau_values=None).learn_tau
    assert UCIConfig(learn_tau=True, tau_init=2.0, tau_lr=0.5).tau_init == 2.0
    assert UCIConfig(tau_values=(1.0, 2.5)).tau_values == (1.0, 2.5)


def test_cli_checks_the_default_out_and_splits_before_reading_the_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The default --out (runs/uci/<the dataset's folder>, an alias resolved) and --splits below
    1 are refused in one line before the data is read."""

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("load_uci called")

    write_folder(tmp_path / "data", name="wine-quality-red")
    monkeypatch.setenv("BAYESGATE_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setattr("bayesgate.models.uci.data.load_uci", never)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").write_text("not a folder")
    assert main(["uci", "--dataset", "wine"]) == 2
    assert capsys.readouterr().err == (
        "bayesgate: error: --out runs/uci/wine-quality-red: runs is a file, not a folder\n"
    )
    out = tmp_path / "out"
    assert main(["uci", "--dataset", "wine", "--splits", "0", "--out", str(out)]) == 2
    assert capsys.readouterr().err == "bayesgate: error: --splits must be ≥ 1, got 0\n"
    assert not out.exists()


def test_cli_progress_shows_the_split_s_grid_and_refit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The bar over splits moves once per split, which on a real data set is many minutes: the
    grid search's and the refit's epochs get bars of their own (left out with --no-progress)."""
    write_folder(tmp_path / "data", name="toy", n=60)
    monkeypatch.setenv("BAYESGATE_DATA_DIR", str(tmp_path / "data"))
    args = ["uci", "--dataset", "toy", "--alpha", "0.5", "--splits", "1", "--k-test", "20"]
    assert main([*args, "--out", str(tmp_path / "a")]) == 0
    err = capsys.readouterr().err
    assert "split 0 grid" in err and "split 0 refit" in err
    assert main([*args, "--out", str(tmp_path / "b"), "--no-progress"]) == 0
    assert "split 0" not in capsys.readouterr().err


def test_cli_learn_tau(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """--learn-tau: no τ grid; each row records the τ it learned (target units), no τ edges."""
    write_folder(tmp_path / "data", name="toy", n=60)
    monkeypatch.setenv("BAYESGATE_DATA_DIR", str(tmp_path / "data"))
    out = tmp_path / "out"
    args = ["uci", "--dataset", "toy", "--alpha", "0.5", "--splits", "1", "--k-test", "20",
            "--epochs", "20", "--learn-tau", "--out", str(out), "--no-progress"]  # fmt: skip
    assert main(args) == 0
    assert "| toy | 0.5 | learned | 1 | 20 |" in capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    assert summary["settings"]["learn_tau"] is True and summary["settings"]["tau_values"] == []
    assert set(summary["grid_edges"]) == {"choices", "dropout", "at_an_edge"}
    with open(out / "results.csv") as f:
        rows = list(csv.DictReader(f))
    taus = [float(r["tau"]) for r in rows]
    assert all(math.isfinite(t) and t > 0 and t != 5.0 for t in taus)  # not the folder's grid


def test_cli_no_refit_and_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    write_folder(tmp_path / "data", name="toy", n=60)
    monkeypatch.setenv("BAYESGATE_DATA_DIR", str(tmp_path / "data"))
    out = tmp_path / "out"
    common = ["--splits", "1", "--epochs", "1", "--k-test", "5", "--no-progress"]
    assert (
        main(["uci", "--dataset", "toy", "--alpha", "1", "--no-refit", "--out", str(out), *common])
        == 0
    )
    assert json.loads((out / "summary.json").read_text())["settings"]["refit"] is False
    one_split = (out / "results.csv").read_text()
    resume = ["--splits", "2", "--epochs", "1", "--k-test", "5", "--no-progress", "--resume"]
    assert (
        main(["uci", "--dataset", "toy", "--alpha", "1", "--no-refit", "--out", str(out), *resume])
        == 0
    )
    both = (out / "results.csv").read_text()
    assert both.startswith(one_split) and len(both.splitlines()) == 3
    capsys.readouterr()
    assert main(["uci", "--dataset", "housing", "--out", str(out), *common]) == 2
    assert "unknown UCI dataset 'housing'" in capsys.readouterr().err
    assert main(["uci", "--dataset", "toy", "--splits", "3", "--out", str(out)]) == 2
    assert "--splits must be in [1, 2]" in capsys.readouterr().err


def test_a_member_s_forward_is_inverted_dropout_by_hand() -> None:
    """``f_g(x) = (relu((x ⊙ z1/(1−p_g)) W1_g + b1_g) ⊙ z2/(1−p_g)) W2_g + b2_g`` at p > 0, with the
    masks ``z = [u < 1−p]`` rebuilt from the same uniform draws (layer 1's, then layer 2's) and
    the product written out row by row; members with different p each get their own 1/(1−p)."""
    net = GroupedDropoutNet(3, 5, [0.2, 0.5], generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        net.b1.normal_(generator=torch.Generator().manual_seed(2))
        net.b2.fill_(0.3)
    x = torch.randn(4, 3, generator=torch.Generator().manual_seed(3))
    got = net(x, torch.Generator().manual_seed(7)).detach()
    draws = torch.Generator().manual_seed(7)
    u1, u2 = torch.rand(2, 4, 3, generator=draws), torch.rand(2, 4, 5, generator=draws)
    for g, p in enumerate(net.rates):
        w1, b1, w2, b2 = (t.detach()[g] for t in (net.w1, net.b1, net.w2, net.b2))
        for r in range(4):
            z1, z2 = (u1[g, r] < 1 - p).float(), (u2[g, r] < 1 - p).float()
            hidden = torch.relu((x[r] * z1 / (1 - p)) @ w1 + b1[0])
            expected = (hidden * z2 / (1 - p)) @ w2 + b2[0]
            torch.testing.assert_close(got[g, r], expected, rtol=1e-5, atol=1e-6)
    assert not torch.equal(u1 < 0.8, torch.ones_like(u1, dtype=torch.bool))  # masks drop units


def test_the_l2_term_is_each_member_s_weights_only_by_hand() -> None:
    """``Σ_g λ_g(‖W1_g‖² + ‖W2_g‖²)`` written out element by element, biases set non-zero to
    show they are left out, and one λ per member."""
    from bayesgate.models.uci.network import member_objective, weight_decay_term

    net = GroupedDropoutNet(2, 3, [0.1, 0.1], generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        net.b1.fill_(5.0)
        net.b2.fill_(-7.0)
    lam = torch.tensor([0.25, 2.0])
    expected = 0.0
    for g in range(2):
        squares = sum(float(w) ** 2 for w in net.w1.detach()[g].flatten()) + sum(
            float(w) ** 2 for w in net.w2.detach()[g].flatten()
        )
        expected += float(lam[g]) * squares
    assert float(weight_decay_term(net, lam).detach()) == pytest.approx(expected, rel=1e-6)
    # the minibatch objective train_members descends: the energies plus exactly this term
    x, y = torch.randn(6, 2), torch.randn(6, 1)
    alphas, taus = torch.tensor([0.0, 0.5]), torch.tensor([1.0, 3.0])
    objective, energies = member_objective(
        net, x, y, alphas, taus, lam, 4, torch.Generator().manual_seed(3)
    )
    reference = grouped_bbalpha_loss(
        mc_forward(net, x, 4, torch.Generator().manual_seed(3)), y, alphas, taus
    )
    torch.testing.assert_close(energies.detach(), reference.detach())
    assert float(objective.detach()) == pytest.approx(
        float(reference.detach().sum()) + expected, rel=1e-6
    )
