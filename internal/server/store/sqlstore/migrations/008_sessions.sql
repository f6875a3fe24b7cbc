-- Web sessions: the sign-in form exchanges a token for a random session id that only the
-- browser's cookie holds; a row keeps the id's SHA-256, the principal signed in and when the
-- session ends. Every replica reads the table, so a sign-out or an expiry holds on all of them.
CREATE TABLE IF NOT EXISTS sessions (
  id_hash TEXT PRIMARY KEY,
  principal TEXT NOT NULL,
  principal_json TEXT NOT NULL DEFAULT '{}',
  created_at BIGINT NOT NULL,
  expires_at BIGINT NOT NULL,
  revoked_at BIGINT NOT NULL DEFAULT 0
);
-- Sign-ins per principal per minute count the principal's newest sessions.
CREATE INDEX IF NOT EXISTS sessions_principal_created ON sessions (principal, created_at);
-- Pruning takes the sessions that expired first.
CREATE INDEX IF NOT EXISTS sessions_expires ON sessions (expires_at);
