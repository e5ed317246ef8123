-- Vaults (see the world's `vault` module): each owner's credentials, sealed by a key
-- the operator holds; the database never sees a value.
CREATE TABLE steadfast_vault (
    owner         TEXT NOT NULL,
    name          TEXT NOT NULL,
    key_id        TEXT NOT NULL,
    nonce         BYTEA NOT NULL,
    ciphertext    BYTEA NOT NULL,
    updated_at_ms BIGINT NOT NULL,
    PRIMARY KEY (owner, name)
);
