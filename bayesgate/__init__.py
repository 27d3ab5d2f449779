"""BayesGate: the command line (``bayesgate``) and, as ``from bayesgate import Gate``, the
service's answers from Python (:class:`bayesgate.service.gate.Gate`); the library lives in
models/, attacks/, service/."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what type checkers see; at run time, __getattr__ below
    from bayesgate.service.gate import Gate

__all__ = ["Gate"]


def __getattr__(name: str) -> Any:
    """``Gate``, imported on first use (the command line's start-up does not pay for torch)."""
    if name == "Gate":
        from bayesgate.service.gate import Gate

        return Gate
    raise AttributeError(f"module 'bayesgate' has no attribute {name!r}")
