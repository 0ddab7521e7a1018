"""The engine process: partitions and their leases, apply-and-commit, effect scheduling."""
