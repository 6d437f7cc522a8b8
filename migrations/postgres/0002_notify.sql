-- Notifications (PostgreSQL): workspace rules, the deliveries planned from the outbox, and every
-- attempt. Times are Unix milliseconds; JSON is stored as TEXT.

-- When the notifier planned the deliveries of an outbox row. Rows written before this
-- migration count as planned, so an upgrade does not notify about the past.
ALTER TABLE outbox ADD COLUMN notify_planned_at BIGINT;
UPDATE outbox SET notify_planned_at = created_at;
CREATE INDEX outbox_unplanned ON outbox (notify_planned_at, id);

CREATE TABLE notification_rules (
    rule_id       TEXT PRIMARY KEY,
    workspace_id  TEXT NOT NULL,
    name          TEXT NOT NULL,
    enabled       BIGINT NOT NULL,
    events        TEXT NOT NULL,
    channels      TEXT NOT NULL,
    created_at    BIGINT NOT NULL,
    updated_at    BIGINT NOT NULL
);
CREATE INDEX notification_rules_workspace ON notification_rules (workspace_id);

-- One row per (event, rule, channel, recipient); the target and the event are copied in, so a
-- later edit of the rule does not change what was planned.
CREATE TABLE deliveries (
    id               BIGSERIAL PRIMARY KEY,
    idempotency_key  TEXT NOT NULL UNIQUE,
    workspace_id     TEXT NOT NULL,
    rule_id          TEXT NOT NULL,
    event_id         TEXT NOT NULL,
    event_type       TEXT NOT NULL,
    channel          TEXT NOT NULL,
    target           TEXT NOT NULL,
    event            TEXT NOT NULL,
    status           TEXT NOT NULL,
    attempts         BIGINT NOT NULL DEFAULT 0,
    next_at          BIGINT NOT NULL,
    last_error       TEXT,
    created_at       BIGINT NOT NULL,
    sent_at          BIGINT
);
CREATE INDEX deliveries_due ON deliveries (status, next_at);
CREATE INDEX deliveries_workspace ON deliveries (workspace_id, id);

CREATE TABLE delivery_attempts (
    id           BIGSERIAL PRIMARY KEY,
    delivery_id  BIGINT NOT NULL,
    attempt      BIGINT NOT NULL,
    at           BIGINT NOT NULL,
    ok           BIGINT NOT NULL,
    status_code  BIGINT,
    error        TEXT,
    took_ms      BIGINT NOT NULL
);
CREATE INDEX delivery_attempts_delivery ON delivery_attempts (delivery_id);
