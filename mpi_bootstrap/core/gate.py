"""The launch gate: mpirun's ssh to the workers, started with mpirun itself, beside the
checks (preflight, the data check) instead of after them: docs/architecture.md, "The
launch gate" (where there is none: launcher/mpi/gating.py).

Which marks a gate waits for, per runtime:
    EACH    its own worker's (`HOST.ok`); the gate of one worker (`last`) also waits
            for `.all.ok`: ORTE and PRRTE with a daemon on every host, which start no
            rank until every daemon has reported (tests/test_gate.py).
    EVERY   `.all.ok` for every worker: hydra, and ORTE's `--novm`.
A host the agent does not check waits for `.all.ok`. A failed check makes the mark
FAILED, on which every waiting gate exits (255) without connecting.

The marks live in `STATE/gate/` (0700, the agent's): `NAME.ok` files, and a FIFO
`NAME.wake` per mark that the gate holds open (read-write: never blocks) while it waits
and the agent writes one line into per gate after making the mark, so a gate wakes at
once and never polls. Pure: the script's text and the marks' names; system/gate.py makes
and opens them.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from mpi_bootstrap.core.names import is_host, is_plain_path

SCRIPT = "ssh-gate"  # in the state directory
DIR = "gate"  # the marks, in the state directory
# The agent's own marks begin with a dot, which no host name does (core/names.py; the
# gate refuses such a host): a host named `all` or `failed` has marks of its own.
ALL = ".all"  # every check passed (and the data check)
FAILED = ".failed"  # a check failed: every gate exits without connecting
EACH = "each"  # mode: a gate waits for its own worker ( + ALL for `last`)
EVERY = "every"  # mode: every gate waits for ALL

# ssh's options that take a value: the host is the first word that is neither an
# option nor such a value (mpirun adds `-x` when its agent is named ssh; hydra always).
SSH_VALUE_OPTIONS = "BbcDEeFIiJLlmOopQRSWw"


def mark(name: str) -> str:
    """The file name of a mark: a worker's name as mpirun uses it, or ALL."""
    if name != ALL and not is_host(name):
        raise ValueError(f"{name!r} is not a host name or address")
    return name


def script(state: str, ssh_command: Sequence[str], mode: str, last: str | None) -> str:
    """The gate, for the state directory `state`: `ssh_command` is what it runs once
    the marks it waits for are there."""
    if not is_plain_path(state):
        raise ValueError(f"{state!r} is not a plain absolute path")
    waits = {EACH: _each(last), EVERY: f"pass {ALL}\n"}[mode]
    return (
        "#!/bin/sh\n"
        "# Written by mpi-bootstrap: mpirun's ssh to a worker, once the agent's checks of\n"
        "# it passed (mpi_bootstrap/core/gate.py). A failed check ends mpirun, and this.\n"
        f"G={shlex.quote(f'{state}/{DIR}')}\n"
        "h=; s=\n"
        "for a do\n"
        '  if [ -n "$s" ]; then s=; continue; fi\n'
        f"  case $a in -[{SSH_VALUE_OPTIONS}]) s=1 ;; -*) ;; *) h=$a; break ;; esac\n"
        "done\n"
        'case $h in ""|*/*|.*) echo "mpi-bootstrap gate: no host in: $*" >&2; exit 255 ;; '
        "esac\n"
        "pass() {  # until mark $1 is made (the agent writes a line to $1.wake after it)\n"
        '  [ -e "$G/$1.ok" ] && return\n'
        '  exec 3<>"$G/$1.wake" || exit 255\n'
        '  until [ -e "$G/$1.ok" ]; do\n'
        f'    [ -e "$G/{FAILED}" ] && exit 255\n'
        "    read -r _ <&3 || exit 255\n"
        "  done\n"
        "  exec 3<&-\n"
        "}\n"
        f"{waits}"
        f'exec {shlex.join(ssh_command)} "$@"\n'
    )


def _each(last: str | None) -> str:
    """A worker the agent checks waits for its own mark; `last`'s gate, and any host it
    does not check, for ALL too."""
    last_test = f' || [ "$h" = {shlex.quote(mark(last))} ]' if last else ""
    return (
        'if [ -p "$G/$h.wake" ]; then pass "$h"; fi\n'
        f'if [ ! -p "$G/$h.wake" ]{last_test}; then pass {ALL}; fi\n'
    )
