-- A message belongs to a conversation: one foreign key to it replaces the two to participants and
-- users. Every message's writer has just written its conversation's row, so the check finds a row
-- it already holds, instead of locking an agent's and a user's rows that every other message of
-- theirs also locks (a reply costs Postgres about a sixth less). Checked at commit, so a writer may
-- still store a message before its conversation's first row in the same transaction.
alter table messages
  add constraint messages_conversation_fkey
    foreign key (participant_id, user_id) references conversations (participant_id, user_id)
    deferrable initially deferred not valid;
-- Checking the rows already there takes a lock that lets writers go on.
alter table messages validate constraint messages_conversation_fkey;
alter table messages
  drop constraint messages_participant_id_fkey,
  drop constraint messages_user_id_fkey;
