-- The report browser: runs newest first (optionally by workspace), and a page of runs' node health.
CREATE INDEX runs_created ON runs (created_at);
CREATE INDEX runs_workspace_created ON runs (workspace_id, created_at);
CREATE INDEX node_health_run ON node_health (run_id);
