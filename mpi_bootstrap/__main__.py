"""`python -m mpi_bootstrap` is the same as the `mpi-bootstrap` command."""

import sys

from mpi_bootstrap.entry import main

sys.exit(main())
