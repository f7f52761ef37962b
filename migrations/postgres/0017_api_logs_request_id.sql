-- The request's id (x-request-id, given by the client or generated), as returned to the client, sent
-- upstream and logged, so a complaint quoting it finds its row. Numbered after the issue that added
-- it (17) so that it cannot collide with a migration written on another branch.
ALTER TABLE api_logs ADD COLUMN request_id TEXT;
CREATE INDEX IF NOT EXISTS api_logs_request_id ON api_logs (request_id);
