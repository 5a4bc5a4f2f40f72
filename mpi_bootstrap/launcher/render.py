"""Render a Plan for people (`--explain`) or programs (`--explain --json`)."""

from __future__ import annotations

import json
import shlex
from itertools import chain
from typing import Any

from mpi_bootstrap.core.errors import printable
from mpi_bootstrap.launcher.model import Plan

JSON_VERSION = 1
_SCALARS = {str, int, float, bool, type(None)}


def as_dict(plan: Plan) -> dict[str, Any]:
    return {
        "version": JSON_VERSION,
        "mpi": {
            "vendor": plan.mpi.vendor,
            "version": plan.mpi.version,
            "runtime": plan.mpi.runtime.name,
            "mpirun": plan.mpi.mpirun,
            "source": plan.mpi.source,
        },
        "hosts": [
            {
                "name": h.name,
                "address": h.address,
                "slots": h.slots,
                "rewritten_to": h.rewritten_to,
                "line": h.line,
            }
            for h in plan.hosts
        ],
        "hostfile": {"path": plan.hostfile_path, "text": plan.hostfile_text},
        "argv": list(plan.argv),
        "env": list(plan.forwarded),
        "env_set": dict(plan.env_set),
        "files": [
            {
                "path": f.path,
                "mode": f"{f.mode:04o}",
                "purpose": f.purpose,
                **({"text": f.text} if f.shown else {}),
            }
            for f in plan.files
        ],
        "wrap": plan.wrap,
        "program_index": plan.program_index,
        "decisions": [
            {"setting": d.setting, "value": d.value, "source": d.source, "reason": d.reason}
            for d in plan.decisions
        ],
    }


def as_json(plan: Plan) -> str:
    """as_dict's text as json.dumps(indent=2) writes it (tests/test_plan.py TestSnapshots)."""
    fields = [f"  {json.dumps(key)}: {_field(value)}" for key, value in as_dict(plan).items()]
    return "{\n" + ",\n".join(fields) + "\n}\n"


def _field(value: Any) -> str:
    """A field of as_dict's, one level in. indent turns json's C encoder off, and the Python
    one took 30 ms over a 4,096-host plan's hosts and decisions: a list of flat objects is
    written by the C encoder, the indent in its separators (an encoded string holds no
    newline, so `},` newline `{` stands only between two objects)."""
    objects = type(value) is list and value and set(map(type, value)) == {dict} and all(value)
    if not objects or not set(map(type, chain.from_iterable(map(dict.values, value)))) <= _SCALARS:
        return json.dumps(value, indent=2).replace("\n", "\n  ")
    text = json.dumps(value, separators=(",\n      ", ": "))[2:-2]
    text = text.replace("},\n      {", "\n    },\n    {\n      ")
    return "[\n    {\n      " + text + "\n    }\n  ]"


def _command(argv: tuple[str, ...], program_index: int) -> str:
    """argv as a copy-pasteable shell command: one option (with its values) per line,
    then the program on a line of its own."""
    lines: list[list[str]] = [[argv[0]]]
    for arg in argv[1:program_index]:
        if arg.startswith("-") or len(lines) == 1:
            lines.append([arg])
        else:
            lines[-1].append(arg)
    if argv[program_index:]:
        lines.append(list(argv[program_index:]))
    return " \\\n    ".join(shlex.join(part) for part in lines)


def _n(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def as_text(plan: Plan) -> str:
    out: list[str] = []
    add = out.append
    add("mpi-bootstrap launcher plan (--explain: nothing was written or started)")
    add("")
    add(
        f"MPI:       {plan.mpi.vendor} {plan.mpi.version} ({plan.mpi.runtime.name}), "
        f"{plan.mpi.mpirun} [{plan.mpi.source}]"
    )
    mode = "wrapping the user's own mpirun command" if plan.wrap else "agent builds mpirun"
    add(f"Mode:      {mode}")
    slots = sum(h.slots for h in plan.hosts)
    add(f"Hosts:     {_n(len(plan.hosts), 'host')}, {_n(slots, 'slot')}")
    width = max(len(h.name) for h in plan.hosts)
    for h in plan.hosts:
        arrow = f" -> {h.rewritten_to}" if h.rewritten_to != h.name else ""
        add(f"  {h.name:<{width}}{arrow}  [{h.address or 'unresolved'}]  slots={h.slots}")
    add("")
    add("Files to write:")
    for f in plan.files:
        add(f"  {f.path} ({f.mode:04o}): {f.purpose}")
    add(f"Hostfile for mpirun ({plan.hostfile_path}):")
    out.extend(f"  | {line}" for line in plan.hostfile_text.splitlines())
    for f in plan.files:
        if f.shown:
            add(f"{f.purpose[:1].upper()}{f.purpose[1:]} ({f.path}):")
            out.extend(f"  | {line}" for line in f.text.splitlines())
    add("")
    add("Environment:")
    for name, value in sorted(plan.env_set.items()):
        add(f"  set     {name}={value}")
    add(f"  forward {', '.join(plan.forwarded) if plan.forwarded else '(none)'}")
    add("")
    add("Command:")
    command = len(out)  # the one entry of several lines
    add("  " + _command(plan.argv, plan.program_index))
    add("")
    add("Decisions:")
    sw = max(len(d.setting) for d in plan.decisions)
    vw = min(40, max(len(d.value) for d in plan.decisions))
    for d in plan.decisions:
        add(f"  {d.setting:<{sw}}  {d.value:<{vw}}  [{d.source}] {d.reason}")
    # Environment values, hostfile lines and mpirun's version come from others: escaped.
    # One entry is one line, but the Command block (the user's argv, its lines broken by
    # us): a newline of another's would start a line that reads as the agent's.
    return "".join(printable(line, lines=i == command) + "\n" for i, line in enumerate(out))
