"""The store: the only code that talks to Redis (logs, snapshots, work streams, leases,
timers), and the embedded redis-server."""
