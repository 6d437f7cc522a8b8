-- The watch while a job runs (docs/watch.md): each node the judgement suspected, once per run
-- (the passed check whose job it watched), node and code.
CREATE TABLE node_suspicions (
    event_id      TEXT PRIMARY KEY,
    run_id        TEXT NOT NULL,
    job_id        TEXT NOT NULL,
    workspace_id  TEXT NOT NULL,
    node          TEXT NOT NULL,
    gpu           TEXT NOT NULL,
    code          TEXT NOT NULL,
    evidence      TEXT NOT NULL,
    since_ms      INTEGER NOT NULL,
    at_ms         INTEGER NOT NULL,
    UNIQUE (run_id, node, code)
);
CREATE INDEX node_suspicions_node ON node_suspicions (node, at_ms);
