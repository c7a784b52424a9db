"""The sessions family: `sessions.*` (params, the life of a session, finding one)."""
