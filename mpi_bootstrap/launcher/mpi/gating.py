"""Which launch gate (core/gate.py) a launch can have. mpirun's ssh to a worker holds
that worker's ranks back; the gate is on only where no rank can start any other way,
and off elsewhere: the checks run first, then mpirun (as with --exec), and the plan's
`launch gate` decision says why.

What starts ranks without mpirun's rsh agent (tests/test_gate.py, class
TestRanksWithoutTheRshAgent, shows each on the real runtime):
- a host of the hostfile that is this pod (the launcher's own name, `localhost`, an
  address it holds; MPI Operator's runLauncherAsWorker): hydra forks its proxy there,
  whose ranks start at once; ORTE and PRRTE start its ranks from mpirun itself, only
  once every daemon has reported;
- ORTE's `--novm` and `--max-vm-size`: daemons only where ranks are mapped (or on the
  first N hosts), so the one host whose gate waits for every check (mode EACH) may get
  none: every gate then waits for every check (EVERY), and a host of this pod's turns
  the gate off. PRRTE (Open MPI 5.0) has no `--novm`, and its `--max-vm-size` left the
  daemons on every host: it is still taken at its word. What an MCA parameter file could
  change (the plm; for EACH, ORTE's VM) is pinned on the command line, where it wins;
- a launcher of the user's that is not ssh (hydra's `-launcher fork`, Open MPI's
  `--mca plm slurm`), or a host list of the user's (`-hosts`, `-H`, a rankfile, an
  appfile): the hosts mpirun starts ranks on are not the ones the agent checked.
"""

from __future__ import annotations

from mpi_bootstrap.core import gate
from mpi_bootstrap.launcher.mpi.builder import Builder, Default

Choice = tuple[str | None, str]  # (gate.EACH | gate.EVERY | None (off), why)

# User options that name the hosts themselves (a hostfile of the user's is not one: the
# agent reads it as the input hostfile, checks its hosts and rewrites it).
HYDRA_HOST_LISTS = ("host", "hosts", "hostlist", "machine", "machines", "machinelist",
                    "hosts-group", "configfile", "rmk", "localhost")
OMPI_HOST_LISTS = ("H", "host", "rankfile", "app", "add-host", "add-hostfile")
ORTE_HOST_LIST_MCA = ("orte_default_dash_host", "orte_rankfile", "rmaps_rank_file_path")

# ORTE's virtual machine, pinned where the user did not set it (an MCA parameter file
# may: the command line wins over it): a daemon on every host of the hostfile before any
# rank starts, which mode EACH needs (`ompi_info --level 9`: orte_no_vm, synonym
# state_novm_select; orte_max_vm_size, whose 0 is no limit).
WHY_VM = ("the launch gate: a daemon on every host of the hostfile (ORTE's virtual "
          "machine, whatever an MCA parameter file says), so the last worker's holds "
          "every rank back")
NO_VM = Default("--mca orte_no_vm", ("--mca", "orte_no_vm", "0"), WHY_VM,
                flags=("novm",), mca=("orte_no_vm", "state_novm_select"),
                env=("OMPI_MCA_orte_no_vm", "OMPI_MCA_state_novm_select"))
MAX_VM = Default("--mca orte_max_vm_size", ("--mca", "orte_max_vm_size", "0"), WHY_VM,
                 flags=("max-vm-size",), mca=("orte_max_vm_size",),
                 env=("OMPI_MCA_orte_max_vm_size",))


def _host_list(b: Builder, flags: tuple[str, ...], mca: tuple[str, ...] = ()) -> str | None:
    """Why the hosts mpirun starts ranks on may not be the hostfile's, or None."""
    source = b.theirs(Default("", (), "", flags=flags, mca=mca,
                              env=tuple(f"OMPI_MCA_{n}" for n in mca)))
    return None if source is None else (
        f"a host list of the user's ({source}): mpirun may start ranks on hosts the "
        "agent did not check, or on this pod without ssh")


def _local(b: Builder) -> str | None:
    """The first host of the hostfile that is this pod, or None."""
    return b.f.local_hosts[0] if b.f.local_hosts else None


def hydra(b: Builder, launch_flags: tuple[str, ...]) -> Choice:
    """Every gate waits for every check (a proxy starts its ranks as soon as it
    connects), where every proxy is started through the gate."""
    why = _host_list(b, HYDRA_HOST_LISTS)
    theirs = [v for name in launch_flags for v in (b.user.values(name) if b.user else [])]
    if why is None and theirs and theirs[0].strip().lower() not in ("ssh", "rsh"):
        why = f"the user's launcher {theirs[0]!r}: hydra starts its proxies without ssh"
    if why is None and (local := _local(b)):
        why = (f"{local} in the hostfile is this pod: hydra forks that host's proxy without "
               "the launcher-exec, and its ranks start at once")
    if why:
        return None, why
    return gate.EVERY, ("a hydra proxy starts its ranks as soon as it connects, and no host "
                        "of the hostfile is this pod")


def openmpi(b: Builder, *, orte: bool, plm: str | None, pins: tuple[Default, ...] = ()
            ) -> Choice:
    """Each gate waits for its worker's check and one (the last worker's) for every
    check, where a daemon starts on every host before any rank (EACH); every gate waits
    for every check where daemons may start only on some hosts and no rank can start
    without one (EVERY); off elsewhere. `plm`: the user's plm setting, if any; `pins`:
    defaults either needs (the plm where nobody named one)."""
    rt = "ORTE" if orte else "PRRTE"
    why = _host_list(b, OMPI_HOST_LISTS, ORTE_HOST_LIST_MCA if orte else ())
    if why is None and plm is not None and (plm.strip().startswith("^") or not {
            c.strip() for c in plm.split(",")} <= {"rsh", "ssh"}):
        why = f"the user's plm {plm!r} may start daemons without ssh"
    if why:
        return None, why
    if orte:
        vm = b.theirs(NO_VM) or b.theirs(MAX_VM)
    else:  # Open MPI 5.0.11's prterun still started a daemon on every host with
        # `--max-vm-size 1` (plm_base_verbose); its help says fewer: taken at its word.
        vm = b.theirs(Default("", (), "", flags=("max-vm-size",)))
    fewer = f"{vm}: {rt} may start daemons on some hosts only"
    if vm is not None and (local := _local(b)):
        return None, f"{fewer}, and {local} in the hostfile is this pod, whose ranks need none"
    for d in (NO_VM, MAX_VM, *pins) if orte and vm is None else pins:
        b.add(d)
    if vm is None:
        return gate.EACH, (f"{rt} starts a daemon on every host of the hostfile, and no "
                           "rank before every daemon has reported")
    return gate.EVERY, (f"{fewer}, so each waits for every check; no host of the hostfile is "
                        "this pod, so every rank needs one")
