"""HTTP: the chat page, operator endpoints (health, readiness, metrics), daphne transport guards."""
