-- Records too big to keep inline keep their body in the blob store.
ALTER TABLE steadfast_events ADD COLUMN blob TEXT;
