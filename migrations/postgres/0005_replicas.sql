-- Several replicas of the service on one database (PostgreSQL; SQLite keeps one).
-- A run is owned by one replica at a time: `owner` holds it until `lease_until`, renewing
-- the lease while it works on the run; `fence` grows by one at every change of owner (or
-- restart of the owner), and every write that ends the run names the fence it holds, so a
-- replica that lost the run cannot end it. `kpartition`: the job-events partition the run's
-- event came from; the replica the consumer group gives that partition takes the run over
-- when the lease runs out.
ALTER TABLE runs ADD COLUMN owner TEXT;
ALTER TABLE runs ADD COLUMN fence BIGINT NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN lease_until BIGINT NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN kpartition BIGINT;

-- Named leases of work only one replica may do at a time (the outbox publisher).
CREATE TABLE leases (
    name    TEXT PRIMARY KEY,
    holder  TEXT NOT NULL,
    token   BIGINT NOT NULL,
    until   BIGINT NOT NULL
);

-- A delivery is claimed by one replica before it is attempted; the claim lapses after
-- `claim_until` (a replica that died mid-attempt), and then another may try it.
ALTER TABLE deliveries ADD COLUMN claimed_by TEXT;
ALTER TABLE deliveries ADD COLUMN claim_until BIGINT NOT NULL DEFAULT 0;
