-- An agent's replies are written by the API process that receives them, without the agent's actor:
-- the conversation's row lock orders a reply against the user's messages and other replies (every
-- reply updates its conversation's row first, so `messages.seq` and `created_at` still follow the
-- order its writers took the row in), and `version`, raised by every change to the row, orders
-- their projections into the agent's Redis inbox (a projection older than what the inbox holds for
-- that conversation is dropped). Rows written before start at 0, as do inbox entries written before.
alter table conversations add column version bigint not null default 0;
-- How many of the user's messages the latest reply answered (the pending count it ended): the reply
-- statement learns from it whether the conversation was waiting, as an UPDATE returns only the row as
-- it left it.
alter table conversations add column answered_count integer not null default 0;
