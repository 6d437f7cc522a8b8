-- A message the broker refuses for good (too large, invalid) is marked failed after a bounded
-- number of attempts, with the broker's error, so it no longer holds back the rows after it.
ALTER TABLE outbox ADD COLUMN attempts INTEGER NOT NULL DEFAULT 0;
ALTER TABLE outbox ADD COLUMN failed_at BIGINT;
ALTER TABLE outbox ADD COLUMN error TEXT;
