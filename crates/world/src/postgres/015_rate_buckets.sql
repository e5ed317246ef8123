-- Rate buckets shared by every API process on this world (see `World::take_tokens`): a
-- caller gets the same rate whichever API host it reaches. A bucket untouched for its
-- whole window is full again, so such rows are pruned as if absent.
CREATE TABLE steadfast_rate_buckets (
    key    TEXT PRIMARY KEY,
    tokens DOUBLE PRECISION NOT NULL,
    at_ms  BIGINT NOT NULL
);
CREATE INDEX steadfast_rate_buckets_by_age ON steadfast_rate_buckets (at_ms);
