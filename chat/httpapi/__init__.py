"""The OpenAI-compatible HTTP API (HTTP-API.md §14): its own door in front of Django for `/v1/`,
whose requests become runs through the same admission and lifecycle as a `chat.send`."""
