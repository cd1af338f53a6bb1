-- Channel history in a cluster (issue 33): a message stamped by a channel
-- grain keeps the id of the publish that made it, so that the channel's next
-- owner, asked again for that publish (its relay heard no answer: the owner
-- crashed or froze after the commit), answers with the stored seq instead of
-- stamping it twice; the unique index refuses a second row for one publish.
-- One-node messages have none (NULL), and the partial index leaves them out.
ALTER TABLE channel_messages ADD COLUMN publish_id TEXT;
--bun:split
CREATE UNIQUE INDEX channel_messages_publish_idx ON channel_messages (project_id, channel, publish_id) WHERE publish_id IS NOT NULL;
