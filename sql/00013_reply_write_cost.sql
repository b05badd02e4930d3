-- Fewer index writes for every message and every change of a conversation's pending state.
--
-- A conversation's row changes with each of the user's messages and each reply, and its pending
-- count was in the predicate of `conversations_pending`: a change of that count could not be a HOT
-- update, so each one wrote a new entry into the primary key too. Without the index, and with room
-- left on each page, the row is updated in place. The index served only the rebuild of an agent's
-- inbox from Postgres (rare: Redis lost the inbox); that now reads the agent's conversations through
-- the primary key and keeps the pending ones. Pages already full make room as their rows move.
drop index conversations_pending;
alter table conversations set (fillfactor = 80);

-- `seq` orders a conversation's messages inside `messages_by_conversation`, and nothing looks a
-- message up by it: its own unique index (the primary key) was one more insert for every message.
-- `id` is the key messages are found and deduplicated by, so it becomes the primary key in place of
-- its unique constraint (one index build, under this migration's lock), which also identifies the
-- rows for logical replication.
alter table messages
  drop constraint messages_pkey,
  drop constraint messages_id_key,
  add constraint messages_pkey primary key (id);
