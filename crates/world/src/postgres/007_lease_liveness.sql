-- The holder's liveness: the backend (pid@start) of its long-lived notification
-- connection. When the holder's process dies, PostgreSQL sees its connection close
-- and the backend vanish from pg_stat_activity, so any worker, on any machine, can
-- take the lease at once instead of waiting for it to lapse. (The lease epoch still
-- fences a holder that is only cut off.)
ALTER TABLE steadfast_sessions ADD COLUMN lease_liveness TEXT;
