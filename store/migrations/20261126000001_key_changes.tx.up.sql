-- Every change to a project's keys (revoke, rotate, the project deleted) is
-- numbered here, so that every running node learns of the changes another
-- process made (another node, `relay admin`) by asking for the numbers past
-- the last it saw. key_change_seq's one row hands out the numbers: a change
-- holds it until it commits, so changes commit in number order and a reader
-- that sees one number sees every smaller one.
CREATE TABLE key_change_seq (
    id  INTEGER PRIMARY KEY CHECK (id = 1),
    seq BIGINT NOT NULL
);
--bun:split
INSERT INTO key_change_seq (id, seq) VALUES (1, 0);
--bun:split
-- revoked: comma-separated hashes of the keys the change revoked (whose
-- sockets close), '' for none. No foreign key: a project's deletion is a
-- change too. Rows are pruned after a while (PruneKeyChanges).
CREATE TABLE key_changes (
    seq        BIGINT PRIMARY KEY,
    project_id {{.UUID}} NOT NULL,
    revoked    TEXT NOT NULL DEFAULT '',
    changed_at {{.TS}} NOT NULL
);
--bun:split
CREATE INDEX key_changes_changed_idx ON key_changes (changed_at);
