-- Inbound hooks (see the world's `hooks` module) and the deliveries they took: a
-- replay is refused by whichever API host it reaches, as only one insert wins.
CREATE TABLE steadfast_hooks (
    session       TEXT NOT NULL,
    name          TEXT NOT NULL,
    verify        TEXT NOT NULL,
    then_do       TEXT NOT NULL,
    token_hash    TEXT,
    key_id        TEXT,
    nonce         BYTEA,
    ciphertext    BYTEA,
    created_at_ms BIGINT NOT NULL,
    created_by    TEXT NOT NULL,
    PRIMARY KEY (session, name)
);
CREATE TABLE steadfast_hook_deliveries (
    session  TEXT NOT NULL,
    name     TEXT NOT NULL,
    delivery TEXT NOT NULL,
    at_ms    BIGINT NOT NULL,
    PRIMARY KEY (session, name, delivery)
);
-- A session's own audit entries, read by its owner a page at a time.
CREATE INDEX steadfast_audit_by_target ON steadfast_audit (target, id);
