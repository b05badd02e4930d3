-- An agent's replies are written by the API process that receives them, without the agent's actor:
-- the conversation's row lock orders a reply against the user's messages and other replies, and this
-- version, raised by every change to the row, orders their projections into the agent's Redis inbox
-- (a projection older than what the inbox holds for that conversation is dropped). Rows written
-- before start at 0, as do inbox entries written before.
alter table conversations add column version bigint not null default 0;
