"""The launcher role: gather facts (facts.py), turn them into a Plan with pure functions
(plan.py and mpi/), then render it (render.py, `--explain`) or carry it out
(execute.py: files, preflight, the hand-off)."""
