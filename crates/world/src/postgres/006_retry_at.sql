-- A session whose driving failed in a way retrying may fix waits until its retry
-- time before any worker takes it (0: at once). Not indexed: appends write it.
ALTER TABLE steadfast_sessions ADD COLUMN retry_at_ms BIGINT NOT NULL DEFAULT 0;
