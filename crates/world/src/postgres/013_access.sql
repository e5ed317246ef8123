-- Tokens issued through the API (hashes only), and the audit log.
CREATE TABLE steadfast_tokens (
    id            TEXT PRIMARY KEY,
    name          TEXT NOT NULL,
    owner         TEXT NOT NULL,
    scopes        TEXT NOT NULL,
    hash          TEXT NOT NULL UNIQUE,
    created_at_ms BIGINT NOT NULL,
    created_by    TEXT NOT NULL,
    expires_at_ms BIGINT,
    revoked_at_ms BIGINT
);
CREATE TABLE steadfast_audit (
    id     BIGSERIAL PRIMARY KEY,
    at_ms  BIGINT NOT NULL,
    actor  TEXT NOT NULL,
    action TEXT NOT NULL,
    target TEXT NOT NULL,
    detail TEXT NOT NULL
);
