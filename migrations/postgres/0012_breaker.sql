-- The isolation backends' circuit breaker, shared by every replica (docs/kubernetes.md).
-- The nodes seen in runs: the fleet whose share may be isolated.
CREATE TABLE breaker_nodes (
    node_name  TEXT PRIMARY KEY,
    seen_at    BIGINT NOT NULL
);

-- Every isolation the breaker was asked about: `admitted` (a slot taken, the isolation under
-- way), then `isolated` (it changed the node), `unchanged` (already isolated, or not ours:
-- the slot is given back) or `failed` (given back); or `refused` (past the cap). The slots
-- within the window are the `admitted` and `isolated` rows younger than it.
CREATE TABLE breaker_actions (
    id         BIGSERIAL PRIMARY KEY,
    node_name  TEXT NOT NULL,
    at         BIGINT NOT NULL,
    outcome    TEXT NOT NULL,
    replica    TEXT NOT NULL,
    backend    TEXT NOT NULL
);
CREATE INDEX breaker_actions_at ON breaker_actions (at);
