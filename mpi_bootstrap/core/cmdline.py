"""The command line's grammar, generated from the settings table (core/settings/):
the parser `Config.from_env` reads flags with, and where the agent's options end and the
user's program begins. Its help is core/helptext.py's. Pure."""

from __future__ import annotations

import argparse
from typing import NoReturn

from mpi_bootstrap.core import helptext
from mpi_bootstrap.core.errors import ConfigError
from mpi_bootstrap.core.settings import ROLES, SETTINGS


class _Parser(argparse.ArgumentParser):
    """argparse that reports problems instead of exiting with 2, and whose help (-h after
    other arguments) is --help-all's."""

    def format_help(self) -> str:
        return helptext.full()

    def error(self, message: str) -> NoReturn:
        prefix = "unrecognized arguments: "
        if message.startswith(prefix):  # one problem per unknown flag, with a near one
            known = [o for a in self._actions for o in a.option_strings if o.startswith("--")]
            raise ConfigError([_unknown(word, known) for word in message[len(prefix) :].split()])
        raise ConfigError([message])


def _unknown(word: str, known: list[str]) -> str:
    """`unknown flag --x`, and the flag it may be a typo of."""
    import difflib

    if not word.startswith("-"):
        return f"unexpected argument {word!r}"
    flag = word.split("=", 1)[0]
    near = difflib.get_close_matches(flag, known, n=1, cutoff=0.75)
    return f"unknown flag {flag}" + (f" (did you mean {near[0]}?)" if near else "")


def make_parser() -> argparse.ArgumentParser:
    """The command line's grammar. Its help is core/helptext.py's (`format_help`), so the
    arguments carry none of their own."""
    parser = _Parser(prog="mpi-bootstrap")
    parser.add_argument("--explain", action="store_true")
    parser.add_argument("--json", action="store_true")
    for s in SETTINGS:
        if s.flag is None:
            continue
        if s.default is False:  # a switch: the flag alone turns it on
            parser.add_argument(
                s.flag, dest=s.name, default=None, action="store_const", const="true"
            )
        else:
            parser.add_argument(s.flag, dest=s.name, default=None)
    parser.add_argument("role", nargs="?")
    parser.add_argument("program", nargs=argparse.REMAINDER)
    return parser


def split_role(argv: list[str]) -> tuple[list[str], str | None, list[str]]:
    """Split argv into (agent options, role word or None, program).

    The role word is optional so that `ENTRYPOINT ["mpi-bootstrap"]` works with the user's
    command as arguments: the first token that is neither an option nor an option's value
    starts the program unless it is a role word.
    """
    takes_value = {s.flag for s in SETTINGS if s.flag and s.default is not False}
    options: list[str] = []
    role: str | None = None
    i = 0
    # A loop, not recursion per role word: `worker worker …` × 1000 hit RecursionError.
    while i < len(argv):
        tok = argv[i]
        if tok == "--":
            return options, role, argv[i + 1 :]
        if tok.startswith("-") and tok != "-":
            options.append(tok)
            if tok in takes_value and "=" not in tok:
                if i + 1 < len(argv):
                    options.append(argv[i + 1])
                i += 2
                continue
            i += 1
            continue
        if tok in ROLES:
            role = role or tok  # the first role word counts; later ones are dropped
            i += 1
            continue
        return options, role, argv[i:]
    return options, role, []
