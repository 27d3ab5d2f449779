"""``bayesgate fetch-data``: download the MNIST files into the data directory.

The same checked download that ``train``, ``evaluate`` and the attack commands run when a file is
missing (:func:`~bayesgate.models.data.download.download_mnist`: every file checked against its
known size and sha256 and the published MD5 of its content, written atomically), as its own step:
for a machine that will run the tests (which never download) or go offline later.

:mod:`.mnist` and :mod:`.download` are imported when the command runs: :mod:`.mnist` imports
torch, which ``bayesgate fetch-data --help`` does not need.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bayesgate.models.data.settings import DATA_DIR_ENV, MIRRORS_ENV


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "fetch-data",
        help="download the four MNIST files into the data directory (checksummed)",
        description="Download the MNIST files missing from <data dir>/mnist/ and check each "
        "against its known size and sha256. Files already there are checked too (their content "
        "against the published MD5); one that fails is fetched again and replaced.",
    )
    p.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help=f"root that holds mnist/ (default: ${DATA_DIR_ENV}, else ~/.cache/bayesgate/data)",
    )
    p.add_argument(
        "--mirror",
        action="append",
        default=None,
        metavar="URL",
        help=f"base URL to fetch from, tried in the order given (repeatable; default: "
        f"${MIRRORS_ENV}, else the built-in mirrors)",
    )
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per connection attempt")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_fetch_data)


def cmd_fetch_data(args: argparse.Namespace) -> int:
    from bayesgate.errors import InvalidArgument

    if not args.timeout > 0:
        raise InvalidArgument(f"--timeout must be > 0 seconds, got {args.timeout:g}")
    from bayesgate.models.data.download import download_mnist, present_file_problem
    from bayesgate.models.data.mnist import MNIST_FILES, DataError, find_mnist_file, mnist_dir

    folder = mnist_dir(args.data_dir)
    before = {n for n in MNIST_FILES if find_mnist_file(folder, n) is not None}
    replaced = {}
    for name in sorted(before):
        path = find_mnist_file(folder, name)
        assert path is not None
        problem = present_file_problem(path, MNIST_FILES[name])
        if problem is not None:
            print(f"{'corrupt':>10}  {path}: {problem}; fetching it again")
            try:
                path.unlink()  # what is downloaded next replaces it (an un-gzipped copy too)
            except OSError as e:
                raise DataError(
                    f"{path}: corrupt, and cannot be removed ({e.strerror or e})"
                ) from e
            replaced[name] = problem
    folder = download_mnist(
        args.data_dir,
        mirrors=args.mirror,
        progress=False if args.no_progress else None,
        timeout=args.timeout,
        mirrors_flag="--mirror",
    )
    for name in MNIST_FILES:
        state = "present" if name in before and name not in replaced else "downloaded"
        print(f"{state:>10}  {find_mnist_file(folder, name)}")
    print(f"MNIST is in {folder} (use it with {DATA_DIR_ENV}={folder.parent})")
    return 0
