"""Events from commit to connection: receivers, broadcaster, the process hub, repair, groups, layers, `agent` events."""
