"""The pure core: what the agent knows, as values and functions — the settings table,
names and addresses, hostfiles, records, the exit-code table, failure signatures.

Standard library only; nothing here reads a file, asks the system or starts a process
(facts are gathered elsewhere and passed in). `make lint` enforces it (import-linter,
pyproject.toml).
"""
