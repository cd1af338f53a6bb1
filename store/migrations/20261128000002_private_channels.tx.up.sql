-- Channel authorization: channels the project marks private beyond the
-- private- prefix, as comma-separated patterns (a channel name, or a prefix
-- ending in *; channel names hold no comma); '' for none.
ALTER TABLE projects ADD COLUMN private_channels TEXT NOT NULL DEFAULT '';
