DROP TABLE channel_messages;
