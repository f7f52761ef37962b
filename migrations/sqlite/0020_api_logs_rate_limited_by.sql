-- Which limit of the route's rate-limit plugin refused the request (`consumer:rpm`,
-- `api_key:per_model:tpm`, `route:concurrency`); NULL when none did. Numbered after the issue that
-- added it (20) so that it cannot collide with a migration written on another branch.
ALTER TABLE api_logs ADD COLUMN rate_limited_by TEXT;
