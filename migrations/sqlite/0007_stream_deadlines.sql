-- Stream deadlines and the attempts a request log row hides (issue 15).
-- Numbered 0007 so that it cannot collide with a 0005 or 0006 written on another branch.

-- An upstream's own stream deadlines in seconds; NULL keeps the config's `upstream:` section's.
ALTER TABLE upstreams ADD COLUMN first_token_timeout_seconds REAL;
ALTER TABLE upstreams ADD COLUMN idle_timeout_seconds REAL;
ALTER TABLE upstreams ADD COLUMN stream_timeout_seconds REAL;

-- Why the attempts before the one that answered failed (or all of them, for a failed request):
-- a JSON array of {provider, endpoint_id, error_type, error}, so that a request that fell back
-- shows the kinds of its failed upstreams (first_token_timeout, response_too_large, ...).
-- NULL when nothing failed.
ALTER TABLE api_logs ADD COLUMN failed_attempts TEXT;
