"""The request methods: chat.*, sessions.*, agents.list (handlers) and the `agent` method (agent)."""
