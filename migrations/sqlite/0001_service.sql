-- The service's tables (SQLite). Times are Unix milliseconds; JSON is stored as TEXT.
CREATE TABLE jobs (
    job_id        TEXT PRIMARY KEY,
    workspace_id  TEXT NOT NULL,
    attempt       INTEGER NOT NULL,
    framework     TEXT,
    nodes         TEXT NOT NULL,
    enable_check  INTEGER NOT NULL,
    check_args    TEXT NOT NULL,
    stopped       INTEGER NOT NULL DEFAULT 0,
    updated_at    INTEGER NOT NULL
);
CREATE TABLE job_events (
    event_id      TEXT PRIMARY KEY,
    job_id        TEXT NOT NULL,
    event_type    TEXT NOT NULL,
    payload       TEXT NOT NULL,
    decision      TEXT NOT NULL,
    received_at   INTEGER NOT NULL
);
CREATE INDEX job_events_job ON job_events (job_id);
CREATE TABLE runs (
    run_id          TEXT PRIMARY KEY,
    job_id          TEXT NOT NULL,
    workspace_id    TEXT NOT NULL,
    attempt         INTEGER NOT NULL,
    cause_event_id  TEXT NOT NULL,
    nodes           TEXT NOT NULL,
    check_args      TEXT NOT NULL,
    settings        TEXT NOT NULL,
    state           TEXT NOT NULL,
    held            INTEGER NOT NULL DEFAULT 0,
    created_at      INTEGER NOT NULL,
    deadline_at     INTEGER NOT NULL,
    finished_at     INTEGER,
    summary         TEXT NOT NULL DEFAULT '',
    report          TEXT
);
CREATE INDEX runs_job ON runs (job_id);
CREATE INDEX runs_state ON runs (state);
CREATE TABLE transitions (
    id      INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id  TEXT NOT NULL,
    state   TEXT NOT NULL,
    detail  TEXT NOT NULL,
    at      INTEGER NOT NULL
);
CREATE INDEX transitions_run ON transitions (run_id);
CREATE TABLE rank_results (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id      TEXT NOT NULL,
    check_name  TEXT NOT NULL,
    rank        INTEGER NOT NULL,
    node_rank   INTEGER,
    host        TEXT,
    status      TEXT NOT NULL,
    metrics     TEXT NOT NULL,
    error       TEXT
);
CREATE INDEX rank_results_run ON rank_results (run_id);
CREATE TABLE findings (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id      TEXT NOT NULL,
    severity    TEXT NOT NULL,
    code        TEXT NOT NULL,
    check_name  TEXT NOT NULL,
    node_name   TEXT,
    rank        INTEGER,
    message     TEXT NOT NULL,
    detail      TEXT NOT NULL
);
CREATE INDEX findings_run ON findings (run_id);
CREATE TABLE node_health (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    node_name  TEXT NOT NULL,
    run_id     TEXT NOT NULL,
    job_id     TEXT NOT NULL,
    healthy    INTEGER NOT NULL,
    codes      TEXT NOT NULL,
    at         INTEGER NOT NULL
);
CREATE INDEX node_health_node ON node_health (node_name, at);
CREATE TABLE outbox (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id    TEXT NOT NULL UNIQUE,
    topic       TEXT NOT NULL,
    msg_key     TEXT NOT NULL,
    payload     TEXT NOT NULL,
    created_at  INTEGER NOT NULL,
    sent_at     INTEGER
);
CREATE INDEX outbox_unsent ON outbox (sent_at, id);
