"""``bench/dependency_floors.py``: the floors it reads from ``pyproject.toml``."""

from __future__ import annotations

import pytest

from tests.bench_scripts import load_bench

floors = load_bench("dependency_floors")


@pytest.mark.parametrize(
    ("requirement", "expected"),
    [
        ("fastapi>=0.132", "fastapi==0.132"),
        ("torch==2.13.0", "torch==2.13.0"),
        ("httptools>=0.6.3,!=0.7.0", "httptools==0.6.3"),
        ("tritonclient[grpc]>=2.40", "tritonclient==2.40"),
        ("granian>=2.8,<3", "granian==2.8"),
    ],
)
def test_floor_is_the_lower_bound_or_the_pin(requirement: str, expected: str) -> None:
    assert floors.floor(requirement) == expected


@pytest.mark.parametrize("requirement", ["numpy", "numpy<2", "numpy>=1.26,>=1.27", "x>=1,!=1"])
def test_a_requirement_without_one_usable_floor_is_refused(requirement: str) -> None:
    with pytest.raises(ValueError, match=requirement.split(">")[0].split("<")[0]):
        floors.floor(requirement)


def test_every_runtime_dependency_has_a_floor_and_ray_is_left_out() -> None:
    meta = floors.project()
    pins = floors.runtime_floors(meta)
    names = [p.split("==")[0] for p in pins]
    assert names[: len(meta["dependencies"])] == [
        r.split(">")[0].split("=")[0].split("[")[0] for r in meta["dependencies"]
    ]
    assert "ray" not in names and "cleverhans" in names
    assert all(not r.startswith("bayesgate") for r in floors.dev_tools(meta))


def test_mismatches_name_what_pip_did_not_install() -> None:
    wanted = ["fastapi==0.132", "orjson==3.9.15", "h11==0.16"]
    got = {"fastapi": "0.132.0", "orjson": "3.10.0"}
    assert floors.mismatches(wanted, got) == [
        "orjson: floor 3.9.15, installed 3.10.0",
        "h11: floor 0.16, installed nothing",
    ]
