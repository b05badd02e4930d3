-- A conversation's row changes with each of the user's messages and each reply, and its pending
-- count was in the predicate of `conversations_pending`: a change of that count could not be a HOT
-- update, so each one wrote a new entry into the primary key too. Without the index, and with room
-- left on each page, the row is updated in place. The index served only the rebuild of an agent's
-- inbox from Postgres (rare: Redis lost the inbox); that now reads the agent's conversations through
-- the primary key and keeps the pending ones. Pages already full make room as their rows move.
-- Both statements change only the catalogue: nothing is rebuilt while the tables are locked.
drop index conversations_pending;
alter table conversations set (fillfactor = 80);
