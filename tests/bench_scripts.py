"""Import a script of ``bench/`` (not a package) by name, for the tests of its functions."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[1] / "bench"


def load_bench(name: str, folder: Path = BENCH) -> ModuleType:
    """``bench/<name>.py`` (or ``folder/<name>.py``: a script of ``deploy/``) executed as a fresh
    module called ``name`` (and registered under that name in ``sys.modules``, as dataclasses
    need)."""
    spec = importlib.util.spec_from_file_location(name, folder / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def run_bayesgate(argv: list[str]) -> None:
    """A ``bayesgate …`` command line (``argv[0]`` the executable, as the bench scripts build it)
    run in this process: the console script's own ``main`` with the same arguments, without a
    new interpreter's ~6 s of imports (torch, and torch._dynamo for the optimiser). torch's
    thread count (``--threads``) is restored afterwards; fails on a non-zero exit code."""
    import torch

    from bayesgate.cli import main

    threads = torch.get_num_threads()
    try:
        code = main(argv[1:])
    finally:
        torch.set_num_threads(threads)
    assert code == 0, f"{' '.join(argv)} exited with {code}"
