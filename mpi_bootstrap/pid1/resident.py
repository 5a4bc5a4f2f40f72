"""The resident process: `python -I -S … mpi_bootstrap.pid1.resident --plan-fd N` (the
hand-off from the launcher or the worker), or, for tests and debugging,
`python -m mpi_bootstrap.pid1 [--grace S] [--group] [--restart N/SECONDS] [--explain]
[--data-probe FIFO] -- PROGRAM ARGS…`. Standard library only.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from mpi_bootstrap.core.errors import ExecError, printable
from mpi_bootstrap.pid1.output import Output, line_logger
from mpi_bootstrap.pid1.restart import WINDOW, RestartPolicy
from mpi_bootstrap.pid1.supervisor import Settings, Supervisor
from mpi_bootstrap.proc import signals, subreaper


def main(argv: Sequence[str] | None = None) -> int:
    spec = read_spec(list(sys.argv[1:] if argv is None else argv))
    if isinstance(spec, str):
        sys.stderr.write(f"mpi-bootstrap proc: {printable(spec, lines=False)}\n")
        return 64
    inherited = spec.get("inherited")
    signals.remember_inherited(frozenset(inherited) if inherited is not None else None)
    output = Output()
    log = line_logger(spec["role"], output, spec["log_level"], spec.get("log_format", "json"))
    restart = RestartPolicy(**spec["restart"]) if spec.get("restart") else None
    sup = Supervisor(Settings(grace=float(spec["grace"]), group=bool(spec["group"]),
                              restart=restart, stop_file=spec.get("stop_file"),
                              stop_text=spec.get("stop_text", ""),
                              explain=bool(spec.get("explain"))), log, output)
    if spec.get("net"):
        from mpi_bootstrap.ssh import netserver

        netserver.serve(spec["net"], log, sup.readers)
    if spec.get("probe"):
        from mpi_bootstrap.pid1 import dataserve

        dataserve.serve(spec["probe"], log, sup.readers)
    sup.install()
    # Set before the hand-off by cli.py (it survives the exec); set here too for
    # `python -m mpi_bootstrap.pid1`.
    if os.getpid() != 1 and (subreaper.is_set() or subreaper.become()):
        log("subreaper", reason="not PID 1: orphans re-parent to the agent and are reaped")
    try:
        code = sup.run(spec["argv"], spec["env"], adopt=spec.get("adopt"),
                       stderr_fd=spec.get("stderr_fd"), tty=bool(spec.get("tty")))
    except ExecError as exc:
        output.write(f"mpi-bootstrap: {printable(exc.message, lines=False)}\n".encode())
        code = int(exc.status)
        sup.reason = exc.message
    if spec.get("probe"):  # nobody reads it now: a session must not wait on it
        with contextlib.suppress(OSError):
            os.unlink(spec["probe"]["fifo"])
    if spec.get("gate_dir"):  # the launch gate's marks (core/gate.py): mpirun has ended
        import shutil

        shutil.rmtree(spec["gate_dir"], ignore_errors=True)
    # Tells the workers (dir exchange) that the job is over — on success only: after a
    # failure the orchestrator may restart the launcher, which needs its workers.
    if spec.get("done_file") and code == 0:
        from mpi_bootstrap.system.files import atomic_write

        with contextlib.suppress(OSError):
            atomic_write(spec["done_file"], spec.get("done_text", f"{code}\n"), 0o644)
    if code != 0 and spec.get("termination_log"):
        _terminated(spec, sup, code)
    output.flush(interrupted=sup.terminating_signal_arrived)
    return code


def _terminated(spec: dict[str, Any], sup: Supervisor, code: int) -> None:
    """The reason, where Kubernetes shows it (core/termination.py)."""
    from mpi_bootstrap.core import termination
    from mpi_bootstrap.system import termlog

    role = spec["role"]
    program = os.path.basename(str(spec["argv"][0]))
    if sup.stop_signal:
        error = (f"ended by {termination.signal_name(code)}, forwarded to {program}"
                 if code > 128 else f"{program} exited {code} after a stop signal")
    else:
        error = sup.reason or f"{program} exited {code}"
    phase = "supervising sshd" if role == "worker" else program
    where = spec["termination_log"]
    termlog.write(where["path"], termination.text(
        role=role, code=code, phase=phase, error=error,
        fix=None if sup.stop_signal else sup.fix or None), create=bool(where["create"]))


def read_spec(args: list[str]) -> dict[str, Any] | str:
    """The spec from the hand-off's memfd, or from test options; a string is an error."""
    spec: dict[str, Any] = {"grace": 10.0, "group": False, "env": dict(os.environ),
                            "role": "launcher", "log_level": "info"}
    while args and args[0] != "--":
        opt = args.pop(0)
        if opt == "--plan-fd":
            with os.fdopen(int(args.pop(0)), "rb") as fh:
                spec.update(json.loads(fh.read()))
        elif opt == "--grace":
            spec["grace"] = float(args.pop(0))
        elif opt == "--group":
            spec["group"] = True
        elif opt == "--data-probe":  # serve the data check's FIFO (pid1/dataserve.py)
            spec["probe"] = {"fifo": args.pop(0)}
        elif opt == "--explain":
            spec["explain"] = True
        elif opt == "--restart":  # LIMIT/WINDOW, e.g. 5/60
            limit, _, window = args.pop(0).partition("/")
            spec["restart"] = {"limit": int(limit), "window": float(window or WINDOW)}
        else:
            return f"unknown option {opt}"
    if args and args[0] == "--":
        spec["argv"] = args[1:]
    if not spec.get("argv"):
        return "no program"
    return spec
