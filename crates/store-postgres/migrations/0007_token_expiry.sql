-- When a token stops working (portal links are short-lived customer
-- tokens); NULL, every existing row's value, means it works until revoked.
ALTER TABLE tokens ADD COLUMN expires_at timestamptz;
