-- The service's tables (PostgreSQL). Times are Unix milliseconds; JSON is stored as TEXT.
CREATE TABLE jobs (
    job_id        TEXT PRIMARY KEY,
    workspace_id  TEXT NOT NULL,
    attempt       BIGINT NOT NULL,
    framework     TEXT,
    nodes         TEXT NOT NULL,
    enable_check  BIGINT NOT NULL,
    check_args    TEXT NOT NULL,
    stopped       BIGINT NOT NULL DEFAULT 0,
    updated_at    BIGINT NOT NULL
);
CREATE TABLE job_events (
    event_id      TEXT PRIMARY KEY,
    job_id        TEXT NOT NULL,
    event_type    TEXT NOT NULL,
    payload       TEXT NOT NULL,
    decision      TEXT NOT NULL,
    received_at   BIGINT NOT NULL
);
CREATE INDEX job_events_job ON job_events (job_id);
CREATE TABLE runs (
    run_id          TEXT PRIMARY KEY,
    job_id          TEXT NOT NULL,
    workspace_id    TEXT NOT NULL,
    attempt         BIGINT NOT NULL,
    cause_event_id  TEXT NOT NULL,
    nodes           TEXT NOT NULL,
    check_args      TEXT NOT NULL,
    settings        TEXT NOT NULL,
    state           TEXT NOT NULL,
    held            BIGINT NOT NULL DEFAULT 0,
    created_at      BIGINT NOT NULL,
    deadline_at     BIGINT NOT NULL,
    finished_at     BIGINT,
    summary         TEXT NOT NULL DEFAULT '',
    report          TEXT
);
CREATE INDEX runs_job ON runs (job_id);
CREATE INDEX runs_state ON runs (state);
CREATE TABLE transitions (
    id      BIGSERIAL PRIMARY KEY,
    run_id  TEXT NOT NULL,
    state   TEXT NOT NULL,
    detail  TEXT NOT NULL,
    at      BIGINT NOT NULL
);
CREATE INDEX transitions_run ON transitions (run_id);
CREATE TABLE rank_results (
    id          BIGSERIAL PRIMARY KEY,
    run_id      TEXT NOT NULL,
    check_name  TEXT NOT NULL,
    rank        BIGINT NOT NULL,
    node_rank   BIGINT,
    host        TEXT,
    status      TEXT NOT NULL,
    metrics     TEXT NOT NULL,
    error       TEXT
);
CREATE INDEX rank_results_run ON rank_results (run_id);
CREATE TABLE findings (
    id          BIGSERIAL PRIMARY KEY,
    run_id      TEXT NOT NULL,
    severity    TEXT NOT NULL,
    code        TEXT NOT NULL,
    check_name  TEXT NOT NULL,
    node_name   TEXT,
    rank        BIGINT,
    message     TEXT NOT NULL,
    detail      TEXT NOT NULL
);
CREATE INDEX findings_run ON findings (run_id);
CREATE TABLE node_health (
    id         BIGSERIAL PRIMARY KEY,
    node_name  TEXT NOT NULL,
    run_id     TEXT NOT NULL,
    job_id     TEXT NOT NULL,
    healthy    BIGINT NOT NULL,
    codes      TEXT NOT NULL,
    at         BIGINT NOT NULL
);
CREATE INDEX node_health_node ON node_health (node_name, at);
CREATE TABLE outbox (
    id          BIGSERIAL PRIMARY KEY,
    event_id    TEXT NOT NULL UNIQUE,
    topic       TEXT NOT NULL,
    msg_key     TEXT NOT NULL,
    payload     TEXT NOT NULL,
    created_at  BIGINT NOT NULL,
    sent_at     BIGINT
);
CREATE INDEX outbox_unsent ON outbox (sent_at, id);
