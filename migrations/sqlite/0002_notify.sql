-- Notifications (SQLite): workspace rules, the deliveries planned from the outbox, and every
-- attempt. Times are Unix milliseconds; JSON is stored as TEXT.

-- When the notifier planned the deliveries of an outbox row. Rows written before this
-- migration count as planned, so an upgrade does not notify about the past.
ALTER TABLE outbox ADD COLUMN notify_planned_at INTEGER;
UPDATE outbox SET notify_planned_at = created_at;
CREATE INDEX outbox_unplanned ON outbox (notify_planned_at, id);

CREATE TABLE notification_rules (
    rule_id       TEXT PRIMARY KEY,
    workspace_id  TEXT NOT NULL,
    name          TEXT NOT NULL,
    enabled       INTEGER NOT NULL,
    events        TEXT NOT NULL,
    channels      TEXT NOT NULL,
    created_at    INTEGER NOT NULL,
    updated_at    INTEGER NOT NULL
);
CREATE INDEX notification_rules_workspace ON notification_rules (workspace_id);

-- One row per (event, rule, channel, recipient); the target and the event are copied in, so a
-- later edit of the rule does not change what was planned.
CREATE TABLE deliveries (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    idempotency_key  TEXT NOT NULL UNIQUE,
    workspace_id     TEXT NOT NULL,
    rule_id          TEXT NOT NULL,
    event_id         TEXT NOT NULL,
    event_type       TEXT NOT NULL,
    channel          TEXT NOT NULL,
    target           TEXT NOT NULL,
    event            TEXT NOT NULL,
    status           TEXT NOT NULL,
    attempts         INTEGER NOT NULL DEFAULT 0,
    next_at          INTEGER NOT NULL,
    last_error       TEXT,
    created_at       INTEGER NOT NULL,
    sent_at          INTEGER
);
CREATE INDEX deliveries_due ON deliveries (status, next_at);
CREATE INDEX deliveries_workspace ON deliveries (workspace_id, id);

CREATE TABLE delivery_attempts (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    delivery_id  INTEGER NOT NULL,
    attempt      INTEGER NOT NULL,
    at           INTEGER NOT NULL,
    ok           INTEGER NOT NULL,
    status_code  INTEGER,
    error        TEXT,
    took_ms      INTEGER NOT NULL
);
CREATE INDEX delivery_attempts_delivery ON delivery_attempts (delivery_id);
