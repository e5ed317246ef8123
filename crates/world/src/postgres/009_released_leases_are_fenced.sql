-- A released lease writes nothing either: while a session has no holder, the fence
-- refuses its events, whatever epoch they carry (a released holder keeps its epoch
-- until someone else takes the lease).
CREATE OR REPLACE FUNCTION steadfast_fence() RETURNS trigger AS $$
DECLARE
    current BIGINT;
    holder TEXT;
BEGIN
    SELECT lease_epoch, lease_holder INTO current, holder
      FROM steadfast_sessions WHERE id = NEW.session_id FOR SHARE;
    IF current IS DISTINCT FROM NEW.epoch OR holder IS NULL THEN
        RAISE EXCEPTION 'stale fence: epoch % on session %, current % (holder %)',
            NEW.epoch, NEW.session_id, current, coalesce(holder, 'none')
            USING ERRCODE = 'SF001';
    END IF;
    RETURN NEW;
END
$$ LANGUAGE plpgsql;
