"""The doctor's word on the net exchange's token: where this pod's settings take it from,
and who else may read it there (core/tokens.py). The doctor never reads the token file
and never needs the token: it looks at the file's mode, owner and path only (files.foreign)."""

from __future__ import annotations

import os
import socket

from mpi_bootstrap.core import tokens
from mpi_bootstrap.core.config import Config
from mpi_bootstrap.doctor.finding import Finding
from mpi_bootstrap.system import files


def findings(config: Config) -> list[Finding]:
    here = f"{socket.gethostname()} (this pod)"
    if config.token_file:
        return [_file_finding(here, config.token_file, str(config.source("token_file")))]
    if config.token is not None:
        detail = f"in the environment ({config.source('token')}): {tokens.EXPOSED}"
        return [Finding(here, "token", True, detail, tokens.HOW_TO_MOVE, warning=True)]
    if config.ex.needs_token:
        fix = (
            f"set {tokens.FILE_VAR} (a key of the job's Secret volume) as on the "
            "launcher and the workers"
        )
        return [Finding(here, "token", False, "the net exchange has no token here", fix)]
    return []


def _file_finding(here: str, path: str, source: str) -> Finding:
    try:
        st = os.stat(path)  # its mode and owner only: the doctor does not read it
        problem = files.foreign(path, st, os.geteuid())  # what the launcher would refuse
    except OSError as exc:
        problem = str(exc.strerror or exc)
    if problem:
        fix = "the launcher and the worker would exit 64: mount the Secret volume there"
        return Finding(here, "token file", False, f"{path} ({source}): {problem}", fix)
    found = tokens.TokenFile(b"", st.st_mode, st.st_uid, st.st_gid)
    who = tokens.other_readers(found, os.geteuid())
    if who:
        return Finding(
            here, "token file", True, f"{path} {who}", tokens.file_advice(), warning=True
        )
    mode = f"mode {st.st_mode & 0o777:04o}, uid {st.st_uid}; in no process's environment"
    return Finding(here, "token file", True, f"{path} ({source}): {mode}")
