"""The resident process: `python -I -S … mpi_bootstrap.pid1.resident --plan-fd N` (the
hand-off from the launcher or the worker, a core/spec.py Spec), or, for tests and
debugging, `python -m mpi_bootstrap.pid1 [--grace S] [--group] [--restart N/SECONDS]
[--explain-failure] [--data-probe FIFO] -- PROGRAM ARGS…`. Standard library only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
from collections.abc import Sequence

from mpi_bootstrap.core import spec as specs
from mpi_bootstrap.core.errors import ExecError, ExitStatus, printable
from mpi_bootstrap.core.log import Log
from mpi_bootstrap.pid1.output import Output, line_logger
from mpi_bootstrap.pid1.restart import WINDOW, RestartPolicy
from mpi_bootstrap.pid1.supervisor import Settings, Supervisor
from mpi_bootstrap.proc import signals, subreaper


def main(argv: Sequence[str] | None = None) -> int:
    spec = read_spec(list(sys.argv[1:] if argv is None else argv))
    if isinstance(spec, str):
        sys.stderr.write(f"mpi-bootstrap proc: {printable(spec, lines=False)}\n")
        return 64
    signals.remember_inherited(frozenset(spec.inherited) if spec.inherited is not None else None)
    output = Output()
    log = line_logger(spec.role, output, spec.log_level, spec.log_format)
    r = spec.restart
    restart = RestartPolicy(limit=r.limit, window=r.window) if r else None
    settings = Settings(
        grace=spec.grace, group=spec.group, restart=restart, explain_failure=spec.explain_failure
    )
    sup = Supervisor(settings, log, output)
    duties(spec, sup, log)
    sup.install()
    # Set before the hand-off by cli.py (it survives the exec); set here too for
    # `python -m mpi_bootstrap.pid1`.
    if os.getpid() != 1 and (subreaper.is_set() or subreaper.become()):
        log("subreaper", reason="not PID 1: orphans re-parent to the agent and are reaped")
    try:
        code = sup.run(
            spec.argv, spec.env, adopt=spec.adopt, stderr_fd=spec.stderr_fd, tty=spec.tty
        )
    except ExecError as exc:
        output.write(f"mpi-bootstrap: {printable(exc.message, lines=False)}\n".encode())
        code = int(exc.status)
        sup.verdict.reason = exc.message
    if spec.control:  # nobody reads it now: a session must not wait on it
        with contextlib.suppress(OSError):
            os.unlink(spec.control)
    if spec.gate_dir:  # the launch gate's marks (core/gate.py): mpirun has ended
        import shutil

        shutil.rmtree(spec.gate_dir, ignore_errors=True)
    # Tells the workers (dir exchange) that the job is over — on success only: after a
    # failure the orchestrator may restart the launcher, which needs its workers.
    if spec.done and code == 0:
        from mpi_bootstrap.system.files import atomic_write

        with contextlib.suppress(OSError):
            atomic_write(spec.done.path, spec.done.text, 0o644)
    if code != 0 and spec.termination:
        _terminated(spec, sup, code)
    output.flush(interrupted=sup.terminating_signal_arrived)
    return code


def duties(spec: specs.Spec, sup: Supervisor, log: Log) -> None:
    """What PID 1 serves beside its main child, as the spec says."""
    if spec.net:
        from mpi_bootstrap.ssh import netserver

        netserver.serve(spec.net, log, sup.readers)
    if spec.stop:
        from mpi_bootstrap.pid1.jobdone import JobDone

        sup.duties.append(JobDone(spec.stop, log, sup.request_stop))
    if spec.control:
        _control(spec, sup, log)
    if spec.monitor:
        from mpi_bootstrap.pid1.lost import monitor

        monitor(spec.monitor, sup, log)


def _control(spec: specs.Spec, sup: Supervisor, log: Log) -> None:
    """The worker's control FIFO and the verbs served on it (pid1/control.py): the data
    check (a worker without the NIC asked for says so), and the claims of its watch."""
    from mpi_bootstrap.pid1 import dataserve
    from mpi_bootstrap.pid1.control import Control

    assert spec.control is not None  # noqa: S101 - the caller checked
    try:
        control = Control(spec.control, log, sup.readers)
        dataserve.serve(control, log)
        if spec.watch:
            from mpi_bootstrap.pid1.watch import WatchService

            watch = WatchService(
                spec.watch, log, sup.readers, control, sshd=lambda: sup.main, stop=sup.request_stop
            )
            sup.duties.append(watch)
    except OSError as exc:  # the job still runs; no claim nor probe is served
        log("control not served", level="error", error=str(exc))


def _terminated(spec: specs.Spec, sup: Supervisor, code: int) -> None:
    """The reason, where Kubernetes shows it (core/termination.py)."""
    from mpi_bootstrap.core import termination
    from mpi_bootstrap.system import termlog

    assert spec.termination is not None  # noqa: S101 - the caller checked
    program = os.path.basename(str(spec.argv[0]))
    if sup.stop_signal:
        error = (
            f"ended by {termination.signal_name(code)}, forwarded to {program}"
            if code > 128
            else f"{program} exited {code} after a stop signal"
        )
    else:
        error = sup.verdict.reason or f"{program} exited {code}"
    phase = (
        "supervising sshd"
        if spec.role == "worker"
        else "ranks running"
        if sup.verdict.code == int(ExitStatus.WORKER_LOST)
        else program
    )
    termlog.write(
        spec.termination.path,
        termination.text(
            role=spec.role,
            code=code,
            phase=phase,
            error=error,
            host=sup.verdict.host or None,
            fix=None if sup.stop_signal else sup.verdict.fix or None,
            signaled=sup.verdict.signaled or bool(sup.stop_signal),
        ),
        create=spec.termination.create,
    )


def read_spec(args: list[str]) -> specs.Spec | str:
    """The spec from the hand-off's memfd, or from test options; a string is an error."""
    if args[:1] == ["--plan-fd"] and len(args) == 2:
        try:
            with os.fdopen(int(args[1]), "rb") as fh:
                return specs.decode(fh.read())
        except (OSError, ValueError) as exc:
            return f"the hand-off's spec: {exc}"
    spec = specs.Spec(argv=(), env=dict(os.environ), grace=10.0)
    while args and args[0] != "--":
        opt = args.pop(0)
        changed = _option(spec, opt, args)
        if changed is None:
            return f"unknown option {opt}"
        spec = changed
    if args and args[0] == "--":
        spec = dataclasses.replace(spec, argv=tuple(args[1:]))
    if not spec.argv:
        return "no program"
    return spec


def _option(spec: specs.Spec, opt: str, args: list[str]) -> specs.Spec | None:
    """`spec` with one test option applied (taking its value from `args`), or None."""
    if opt == "--grace":
        return dataclasses.replace(spec, grace=float(args.pop(0)))
    if opt == "--group":
        return dataclasses.replace(spec, group=True)
    if opt == "--data-probe":  # serve the data check on FIFO (pid1/dataserve.py)
        return dataclasses.replace(spec, control=args.pop(0))
    if opt == "--explain-failure":
        return dataclasses.replace(spec, explain_failure=True)
    if opt == "--restart":  # LIMIT/WINDOW, e.g. 5/60
        limit, _, window = args.pop(0).partition("/")
        return dataclasses.replace(spec, restart=specs.Restart(int(limit), float(window or WINDOW)))
    return None
