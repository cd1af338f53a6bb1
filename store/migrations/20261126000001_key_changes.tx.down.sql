DROP TABLE key_changes;
--bun:split
DROP TABLE key_change_seq;
