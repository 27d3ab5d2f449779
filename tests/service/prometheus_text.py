"""Reading ``/metrics`` in tests and ``bench/hostile.py``: the one parser of the Prometheus text
format they share.

The text is parsed by ``prometheus_client``'s own parser (``text_string_to_metric_families``), not
by a regular expression of ours, so a malformed exposition fails here rather than being read
loosely. Samples are keyed by their sample name (``…_total``, ``…_bucket``, ``…_count``) and their
exact label set.
"""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def samples(text: str) -> Samples:
    """Prometheus text → ``{(sample name, frozenset of labels): value}``."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def family_names(text: str) -> set[str]:
    """The metric family names in the text (``bayesgate_http_requests`` for its ``_total``)."""
    return {family.name for family in text_string_to_metric_families(text)}


def value(table: Mapping[tuple[str, frozenset], float], name: str, **labels: str) -> float:
    """The sample ``name`` with exactly ``labels`` in a parsed table (0 when absent)."""
    return table.get((name, frozenset(labels.items())), 0.0)


def sample(text: str, name: str, **labels: str) -> float:
    """The sample ``name`` with exactly ``labels``; an assertion error naming it when absent."""
    table = samples(text)
    key = (name, frozenset(labels.items()))
    assert key in table, f"{name}{labels or ''} not in the exposition"
    return table[key]


def metric_value(text: str, name: str, **labels: str) -> float:
    """Sum of the samples ``name`` whose labels include ``labels`` (0 when none): e.g. every
    route's 500s with ``status="500"``."""
    wanted = labels.items()
    return sum(
        v for (n, got), v in samples(text).items() if n == name and all(kv in got for kv in wanted)
    )
