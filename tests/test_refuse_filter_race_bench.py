"""bench/refuse_filter_race.py, one short cycle each: it counts each client's connections by outcome
for both filters, and the product's filter is the one it measures as ``syn-only``."""

from __future__ import annotations

import sys

import pytest
from bench_scripts import load_bench

from bayesgate.service.http_server import REFUSE_SYN_FILTER


@pytest.mark.skipif(sys.platform != "linux", reason="SO_ATTACH_FILTER is Linux's")
def test_both_filters_are_measured_and_every_client_ends_refused() -> None:
    bench = load_bench("refuse_filter_race")
    assert bench.FILTERS["syn-only"] is REFUSE_SYN_FILTER
    for program in bench.FILTERS.values():
        counts = bench.run(program, cycles=1, clients=2)
        assert counts["ok"] > 0, counts
        # each client thread ends at its first refused connection: the closed port answered it
        assert counts["refused"] == 2, counts
        assert set(counts) <= {"ok", "reset", "refused"}, counts
