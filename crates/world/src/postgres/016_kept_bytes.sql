-- What each session's history keeps beyond its log: the bytes its tool calls'
-- snapshots stored and their outputs offloaded (see `World::owner_kept_bytes`), summed
-- per owner for the history quota. Sessions recorded before this count from here on.
ALTER TABLE steadfast_sessions ADD COLUMN kept_bytes BIGINT NOT NULL DEFAULT 0;
