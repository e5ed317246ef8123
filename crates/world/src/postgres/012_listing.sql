-- Sessions listed by owner a page at a time: what they run, their labels and metadata,
-- a title the owner set (kept over the first message's), and an index per owner in
-- the listing's order. None of these columns changes on an ordinary append, so the
-- session row's updates stay in place (HOT).
ALTER TABLE steadfast_sessions ADD COLUMN agent TEXT NOT NULL DEFAULT '';
ALTER TABLE steadfast_sessions ADD COLUMN labels JSONB NOT NULL DEFAULT '{}';
ALTER TABLE steadfast_sessions ADD COLUMN metadata JSONB NOT NULL DEFAULT '{}';
ALTER TABLE steadfast_sessions ADD COLUMN title_set BOOLEAN NOT NULL DEFAULT false;
UPDATE steadfast_sessions s SET agent = coalesce(
    (SELECT convert_from(e.body, 'UTF8')::jsonb #>> '{session_started,agent}'
       FROM steadfast_events e
      WHERE e.session_id = s.id AND e.seq = 1 AND e.kind = 'session_started' AND e.blob IS NULL),
    '');
CREATE INDEX steadfast_sessions_by_owner ON steadfast_sessions (owner, created_at_ms DESC, id DESC);
CREATE INDEX steadfast_sessions_labels ON steadfast_sessions USING gin (labels jsonb_path_ops);
