"""`python -m mpi_bootstrap.pid1 -- PROGRAM ARGS…`: the resident supervisor by hand."""

import sys

from mpi_bootstrap.pid1.resident import main

sys.exit(main())
