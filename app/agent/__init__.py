"""Tools in chats, without Qt: the MCP servers a user configured (`mcp.json`), the host that runs them,
and the one agent loop (reply -> tool calls -> approval -> call -> next reply) the GUI and the CLI share."""
