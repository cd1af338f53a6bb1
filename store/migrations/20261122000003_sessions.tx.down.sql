DROP TABLE session_revocations;
--bun:split
DROP TABLE session_epochs;
