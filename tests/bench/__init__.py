"""The benchmarks (`make bench`, `bench-scale`, `soak`, …), and what more than one of them
takes on its command line."""

from __future__ import annotations

import argparse


def add_worker_env(ap: argparse.ArgumentParser) -> None:
    """`--worker-env NAME=VALUE`, repeatable: a setting every worker gets beside the job's."""
    ap.add_argument(
        "--worker-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a setting of every worker's (MPI_BOOTSTRAP_SSH_SERVER=agent: the agent's own "
        "ssh server)",
    )


def worker_env(args: argparse.Namespace) -> dict[str, str]:
    """The settings `--worker-env` gave, by name."""
    return dict(kv.split("=", 1) for kv in args.worker_env)
