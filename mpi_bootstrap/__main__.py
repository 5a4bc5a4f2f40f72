"""`python -m mpi_bootstrap` is the same as the `mpi-bootstrap` command."""

import sys

from mpi_bootstrap.cli import main

sys.exit(main())
