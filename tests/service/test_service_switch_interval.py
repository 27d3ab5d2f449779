"""While it serves, the app runs CPython with a short thread switch interval, and puts the
previous one back when it stops — also when its start-up fails.

The worker thread releases the GIL inside every torch op; a thread waiting for the GIL asks the
holder to drop it only after the switch interval, so with Python's 5 ms the event loop's Python
work stalled the model between ops (issue 19: the batched server answered 21 % more images per
second at 100 µs, docs/performance.md).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from bayesgate.service.errors import StartupError
from bayesgate.service.settings import Settings

pytestmark = pytest.mark.anyio


async def test_switch_interval_is_set_while_serving_and_restored_after(
    serving: Callable[[Settings], Any], make_settings: Callable[..., Settings]
) -> None:
    before = sys.getswitchinterval()
    assert before != pytest.approx(250e-6)
    async with serving(make_settings(switch_interval_us=250)) as (_, client):
        during = sys.getswitchinterval()
        assert (await client.get("/healthz")).status_code == 200
    assert during == pytest.approx(250e-6)
    assert sys.getswitchinterval() == before


async def test_default_is_100_us(
    serving: Callable[[Settings], Any], make_settings: Callable[..., Settings]
) -> None:
    async with serving(make_settings()) as _:
        assert sys.getswitchinterval() == pytest.approx(100e-6)


async def test_restored_when_start_up_fails(
    serving: Callable[[Settings], Any], make_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    before = sys.getswitchinterval()
    with pytest.raises(StartupError, match="missing"):
        async with serving(make_settings(model_dir=tmp_path / "missing")) as _:
            pass
    assert sys.getswitchinterval() == before


@pytest.mark.parametrize("value", [0, -5, 2_000_000])
def test_out_of_range_values_are_refused(value: float) -> None:
    with pytest.raises(ValidationError, match="switch_interval_us"):
        Settings(switch_interval_us=value)
