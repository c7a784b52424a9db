"""Tools: the MCP client side of the gateway (a pool of MCP server sessions) and the built-in demo server."""
