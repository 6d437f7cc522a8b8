-- Fleet baselines: one row per passed rank's headline figure, learned when its run ended
-- (only passed runs without fault injection, only ranks no finding names). Append-only: the
-- baseline (median and MAD of the newest window per key) is computed when it is read, so
-- replicas ending runs at once only insert. `fkey`: the baseline key as JSON (device, driver
-- major, check, metric, conditions); one figure per (run, rank, key), so a run ended twice
-- (a replica that lost its lease) adds nothing.
CREATE TABLE fleet_samples (
    run_id     TEXT NOT NULL,
    rank       BIGINT NOT NULL,
    fkey       TEXT NOT NULL,
    node_name  TEXT NOT NULL,
    value      DOUBLE PRECISION NOT NULL,
    at         BIGINT NOT NULL,
    PRIMARY KEY (run_id, rank, fkey)
);
CREATE INDEX fleet_samples_key ON fleet_samples (fkey, at);
