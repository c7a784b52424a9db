"""HTTP views: the chat page is in `page_views`, /healthz /readyz /metrics in `ops_views`."""
