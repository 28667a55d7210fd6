-- The application's table, before Sliceplane: users and their profiles.
CREATE TABLE users (name text PRIMARY KEY, profile jsonb NOT NULL);
INSERT INTO users SELECT 'user' || i, jsonb_build_object('plan', 'free', 'n', i) FROM generate_series(1, 1000) i;
