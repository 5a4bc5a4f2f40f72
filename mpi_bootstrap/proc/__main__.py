"""`python -m mpi_bootstrap.proc -- PROGRAM ARGS…`: the resident supervisor by hand."""

import sys

from mpi_bootstrap.proc.resident import main

sys.exit(main())
