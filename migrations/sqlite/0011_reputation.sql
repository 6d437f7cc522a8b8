-- Node reputation, re-check before isolation, quarantine (docs/fleet.md).
-- A re-check is a run of its own, of one node, made when a run failed on a non-definitive
-- finding: `recheck_of` names the run it re-checks (NULL for a job's own runs). It is owned
-- and taken over like any run (the lease columns), so among replicas it is done once.
ALTER TABLE runs ADD COLUMN recheck_of TEXT;

-- Every decision about isolating a node, with its reason: isolated (definitive, quarantine,
-- reproduced, immediate), re-check started, or cleared by a re-check that passed.
CREATE TABLE node_decisions (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    node_name    TEXT NOT NULL,
    run_id       TEXT NOT NULL,
    decision     TEXT NOT NULL,
    basis        TEXT NOT NULL,
    reason       TEXT NOT NULL,
    codes        TEXT NOT NULL,
    recheck_run  TEXT,
    at           INTEGER NOT NULL
);
CREATE INDEX node_decisions_node ON node_decisions (node_name, at);
