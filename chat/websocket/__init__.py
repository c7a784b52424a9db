"""One WebSocket connection: consumer, handshake, its filters, outbound limits, origin, rate limit, revocation."""
