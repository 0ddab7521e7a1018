"""MCP connectors: the engine as an MCP client (connection.py) and its runners."""
