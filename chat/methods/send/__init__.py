"""The send family: `chat.send`, `sessions.steer` and `chat.abort` (params, admission, acks, handlers)."""
