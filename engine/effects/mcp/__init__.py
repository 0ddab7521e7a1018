"""MCP connectors: the engine as an MCP client: one connection per server
(connection.py) over stdio or HTTP (transport.py), its failures worded (trouble.py),
and the runners of syncs and calls (runners.py)."""
