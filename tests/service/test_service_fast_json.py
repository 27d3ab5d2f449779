"""The lean request path: ``/v1/predict``'s orjson body equals the pydantic encoding
(:class:`bayesgate.service.schemas.PredictResponse` of
:func:`~bayesgate.service.schemas.predict_response`) key for key; orjson parsing keeps the field
messages of ``json``."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import torch

from bayesgate.service import fast_json
from bayesgate.service.errors import InvalidInput
from bayesgate.service.request_body import parse_json
from bayesgate.service.schemas import PredictResponse, predict_response
from bayesgate.service.settings import Settings

pytestmark = pytest.mark.anyio


async def test_predict_body_equals_the_pydantic_encoding(
    serving: Callable[[Settings], Any], make_settings: Callable[..., Settings]
) -> None:
    x = torch.rand(3, 1, 28, 28, generator=torch.Generator().manual_seed(2))
    async with serving(make_settings()) as (app, client):
        worker = app.state.worker
        for samples, seed in ((False, None), (True, 4)):
            preds = await worker.predict(x, 5, seed=seed, return_samples=samples, timeout_s=30)
            body = predict_response(preds, 5, seed)
            fast = json.loads(fast_json.json_response(body).body)
            reference = PredictResponse.model_validate(body).model_dump(mode="json")
            assert fast == reference
            assert list(fast["predictions"][0]) == list(reference["predictions"][0])  # key order
            assert (fast["predictions"][0]["samples"] is not None) == samples
        http = await client.post(
            "/v1/predict", json={"instances": x.tolist(), "mc_samples": 5, "seed": 4}
        )
    assert http.status_code == 200 and http.headers["content-type"] == "application/json"
    preds_again = PredictResponse.model_validate(predict_response(preds, 5, 4)).model_dump(
        mode="json"
    )
    for row in preds_again["predictions"]:
        row["samples"] = None  # the HTTP request did not ask for them
    assert http.json() == preds_again


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b'{"a": [1, 2.5, true, null, "x"]}', {"a": [1, 2.5, True, None, "x"]}),
        (b'{"n": NaN}', None),  # orjson rejects; json accepts → nan (reported later as not finite)
        (b'{"seed": 18446744073709551616}', {"seed": 2**64}),  # past 64 bits: json's int
    ],
)
def test_parse_json_matches_the_standard_library(body: bytes, expected: Any) -> None:
    got = parse_json(body)
    if expected is None:
        assert got["n"] != got["n"]  # NaN
    else:
        assert got == expected == json.loads(body)


def test_parse_json_rejects_invalid_json_and_deep_nesting() -> None:
    with pytest.raises(InvalidInput, match="not valid JSON"):
        parse_json(b'{"a": ')
    with pytest.raises(InvalidInput, match="nested too deeply"):
        parse_json(b"[" * 100_000 + b"]" * 100_000)
