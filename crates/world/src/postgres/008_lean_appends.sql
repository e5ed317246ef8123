-- Appends that change nothing but the log insert their events and nothing else: the
-- session row is written only when its status, title, awaited signal or retry time
-- changes, so its last_seq and updated_at_ms become a watermark (the position at the
-- last such change; readers take the true position from the log's primary key).
-- The fence trigger already refuses events of a session that does not exist (its
-- epoch is NULL), so the per-row foreign-key check that repeated it goes; deleting a
-- session deletes its events explicitly.
ALTER TABLE steadfast_events DROP CONSTRAINT IF EXISTS steadfast_events_session_id_fkey;
