"""bench/load.py, the benchmark behind issue 19's figures: its ratios are the arithmetic its docs
state, and one short run against a real server produces every row and figure from its own parts.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.bench_scripts import BENCH, load_bench


@pytest.fixture()
def load(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(BENCH))  # load.py imports load_protocols from bench/
    return load_bench("load")


def row(mode: str, throughput: float, cpu: float, mean_batch: float) -> dict[str, object]:
    return {
        "mode": mode,
        "throughput": throughput,
        "cpu_ms_per_request": cpu,
        "mean_batch": mean_batch,
        "cpu_ms_loop": cpu / 2,
    }


def test_ratios_are_taken_against_the_engine_at_the_rounded_mean_batch(load: ModuleType) -> None:
    engines = {
        1: row("engine B=1", 500.0, 2.0, 1.0),
        8: row("engine B=8", 1200.0, 0.8, 8.0),
        16: row("engine B=16", 1600.0, 0.6, 16.0),
    }
    batched = [
        row("/v1 JSON", 900.0, 1.5, 15.6),  # rounds to 16
        row("/v2 binary", 1000.0, 1.2, 7.6),  # rounds to 8
    ]
    single = [row("/v2 binary", 250.0, 3.1, 1.0)]
    served = {8: row("served model B=8", 1000.0, 0.95, 8.0)}  # no B=16 reference
    ratios = load.ratios_and_outside(batched, single, engines, served)

    v1, v2 = batched
    assert v1["service_over_engine"] == pytest.approx(900 / 1600)
    assert v1["cpu_ms_outside_model"] == pytest.approx(1.5 - 0.6)
    assert v1["engine_cpu_over_service_cpu"] == pytest.approx(0.6 / 1.5)
    assert "batching_over_no_batching" not in v1  # no unbatched run of /v1 JSON
    assert v2["service_over_engine"] == pytest.approx(1000 / 1200)
    assert v2["cpu_ms_outside_model"] == pytest.approx(1.2 - 0.8)
    assert v2["cpu_ms_outside_served_model"] == pytest.approx(1.2 - 0.95)
    assert "cpu_ms_outside_served_model" not in v1  # no served-model row at its batch
    assert v2["batching_over_no_batching"] == pytest.approx(1000 / 250)
    assert single[0]["mode"] == "/v2 binary unbatched"
    assert single[0]["cpu_ms_outside_model"] == pytest.approx(3.1 - 2.0)
    assert ratios["best_protocol"] == "/v2 binary"
    assert ratios["service_over_engine_best"] == pytest.approx(1000 / 1200)
    assert ratios["engine_batch_gain"] == {"batch": 16, "ratio": pytest.approx(1600 / 500)}
    text = load.summary(batched, ratios)
    assert "best service / engine: 0.83 (/v2 binary)" in text
    assert "4.00×" in text and "B=16 ÷ B=1: 3.20×" in text


def test_percentiles_and_latency_stats(load: ModuleType) -> None:
    latencies = [i / 1000 for i in range(1, 101)]  # 1 … 100 ms
    stats = load.latency_stats(latencies, failures=2, wall=4.0)
    assert stats["requests"] == 100 and stats["failed"] == 2
    assert stats["throughput"] == pytest.approx(25.0)
    assert stats["p50_ms"] == pytest.approx(51.0)  # the sample at index ⌊0.5·100⌋
    assert stats["p99_ms"] == pytest.approx(100.0)
    assert stats["mean_ms"] == pytest.approx(50.5)
    assert math.isnan(load.percentile([], 50))


def test_a_short_run_measures_a_real_server_and_the_engine(
    load: ModuleType,
    tiny_model_dir: Path,
    mnist_root: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``/v2 binary`` batched and unbatched for one second each, then the engine alone; every
    derived figure in the JSON is recomputed here from the rows it came from."""
    monkeypatch.setenv("BAYESGATE_DATA_DIR", str(mnist_root))
    out = tmp_path / "not-yet" / "load.json"  # the folder is made at the start
    argv = ["--model-dir", str(tiny_model_dir), "--duration", "1", "--clients", "4"]
    argv += ["--max-batch-size", "8", "--protocols", "/v2 binary", "--json", str(out)]
    assert load.main(argv) == 0
    printed = capsys.readouterr().out
    result = json.loads(out.read_text())
    rows = {r["mode"]: r for r in result["rows"]}
    batched, single = rows["/v2 binary"], rows["/v2 binary unbatched"]
    for r in (batched, single):
        assert r["requests"] > 0 and r["failed"] == 0
        assert r["cpu_ms_per_request"] > 0 and r["cpu_ms_loop"] > 0
        assert r["worker_busy"] > 0
    assert single["mean_batch"] == 1.0  # max batch 1: every engine call one image
    # by thread name: the live threads' share of the same process's CPU, within it
    by_name = batched["cpu_ms_by_thread_name"]
    assert by_name and all(v >= 0 for v in by_name.values()) and max(by_name.values()) > 0
    # /proc counts each thread and the process in whole clock ticks, each rounded on its own:
    # within one tick per thread of the process total
    tick_ms_per_image = 1000 / os.sysconf("SC_CLK_TCK") / batched["requests"]
    slack = len(by_name) * tick_ms_per_image
    assert sum(by_name.values()) <= batched["cpu_ms_per_request"] + slack
    assert batched["cpu_ms_threads_ended"] == pytest.approx(
        batched["cpu_ms_per_request"] - sum(by_name.values())
    )
    assert batched["cpu_ms_threads_ended"] >= -slack
    # the worker's threads carry OS names of their own, so the split shows them apart
    assert by_name.get("bg-worker", 0) > 0 and "bg-answers" in by_name
    line = next(x for x in printed.splitlines() if x.startswith("  /v2 binary  "))
    assert f"bg-worker {by_name['bg-worker']:.3f}" in line
    assert 1.0 <= batched["mean_batch"] <= 8.0
    engine = rows[f"engine B={max(1, round(batched['mean_batch']))}"]
    assert batched["cpu_ms_outside_model"] == pytest.approx(
        batched["cpu_ms_per_request"] - engine["cpu_ms_per_request"]
    )
    assert batched["service_over_engine"] == pytest.approx(
        batched["throughput"] / engine["throughput"]
    )
    assert batched["batching_over_no_batching"] == pytest.approx(
        batched["throughput"] / single["throughput"]
    )
    assert {"engine B=1", "engine B=4"} <= set(rows)  # B=1 and max batch ÷ 2 always
    model = rows[f"served model B={max(1, round(batched['mean_batch']))}"]
    assert batched["cpu_ms_outside_served_model"] == pytest.approx(
        batched["cpu_ms_per_request"] - model["cpu_ms_per_request"]
    )
    assert model["requests"] > 0 and model["cpu_ms_per_request"] > 0
    assert result["model"] == "tiny-mlp" and result["best_protocol"] == "/v2 binary"
    assert "best service / engine" in printed and "/v2 binary unbatched" in printed
    assert sys.modules["load"] is load


def test_several_images_per_request_are_counted_per_image(
    load: ModuleType,
    tiny_model_dir: Path,
    mnist_root: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--images-per-request 3``: each body holds 3 consecutive images (so every engine call has
    at least 3 rows), the figures count images, and no unbatched server is run."""
    import load_protocols as lp
    import torch

    images = torch.rand(10, 1, 28, 28)
    protocol, bodies = lp.v2_binary(images, 5, "m", per_request=3)
    assert len(bodies) == 3  # the tenth image is left out
    head = json.loads(bodies[1][: protocol.header_lengths[1]])
    assert head["inputs"][0]["shape"] == [3, 1, 28, 28]
    raw = bodies[1][protocol.header_lengths[1] :]
    assert raw == images[3:6].numpy().astype("<f4").tobytes()
    _, v1 = lp.v1_json(images, 5, per_request=3)
    assert len(json.loads(v1[0])["instances"]) == 3
    with pytest.raises(ValueError, match="per_request"):
        lp.groups(images, 11)

    monkeypatch.setenv("BAYESGATE_DATA_DIR", str(mnist_root))
    out = tmp_path / "load.json"
    argv = ["--model-dir", str(tiny_model_dir), "--duration", "1", "--clients", "4"]
    argv += ["--max-batch-size", "8", "--protocols", "/v2 binary", "--images-per-request", "3"]
    assert load.main([*argv, "--json", str(out)]) == 0
    assert "3 images per request" in capsys.readouterr().out
    rows = {r["mode"]: r for r in json.loads(out.read_text())["rows"]}
    assert "/v2 binary unbatched" not in rows
    r = rows["/v2 binary"]
    assert r["failed"] == 0 and r["images_per_request"] == 3
    assert r["requests"] == 3 * r["http_requests"] > 0
    assert 3.0 <= r["mean_batch"] <= 8.0
    engine = rows[f"engine B={max(1, round(r['mean_batch']))}"]
    assert r["cpu_ms_outside_model"] == pytest.approx(
        r["cpu_ms_per_request"] - engine["cpu_ms_per_request"]
    )

    with pytest.raises(SystemExit) as refused:
        load.main([*argv[:-4], "--protocols", "/v1 PNG", "--images-per-request", "3"])
    assert refused.value.code == 2
    assert "--images-per-request > 1 works with" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        load.main([*argv[:-4], "--protocols", "/v2 binary", "--images-per-request", "9"])
    assert "must be in 1 … --max-batch-size (8)" in capsys.readouterr().err


def test_the_json_folder_is_made_before_the_runs_or_refused(
    load: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--json`` in a folder that cannot be made: a usage error before any run (a run of minutes
    must not end in a traceback at the write; one that does not exist yet is made at the start,
    as the short run above shows); argument errors come before the folder is made."""
    import time

    target = tmp_path / "new" / "deeper" / "out.json"
    blocker = tmp_path / "file"
    blocker.write_text("")
    start = time.monotonic()
    with pytest.raises(SystemExit) as refused:
        load.main(["--json", str(blocker / "sub" / "out.json"), "--duration", "1"])
    assert refused.value.code == 2 and time.monotonic() - start < 5  # no server was started
    assert "--json: cannot make" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # a bad protocol after a good --json: refused, folder made
        load.main(["--json", str(target), "--protocols", "nope"])
    assert not target.parent.is_dir()  # argument errors come first
