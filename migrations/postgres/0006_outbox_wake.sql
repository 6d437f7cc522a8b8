-- Every transaction that queues outbox rows announces itself on the channel `gpusanity_outbox`
-- (NOTIFY is delivered at commit, once per transaction, and not at all on a rollback). The
-- publisher of every replica listens (db/src/wake.rs), so rows committed by a replica that does
-- not hold the publisher's lease are sent at once, not at the holder's next look at the table.
CREATE FUNCTION outbox_queued() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('gpusanity_outbox', '');
    RETURN NULL;
END
$$;

CREATE TRIGGER outbox_queued AFTER INSERT ON outbox FOR EACH STATEMENT EXECUTE FUNCTION outbox_queued();
