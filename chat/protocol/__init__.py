"""Protocol v4 on the wire: frames parsed and validated (frames), payloads encoded (wire)."""
