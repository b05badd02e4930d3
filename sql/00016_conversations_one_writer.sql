-- Replies are applied by the agent's actor, like the user's messages: a conversation's row has one
-- writer, and the agent's Redis inbox is written only under the actor's hold (fenced in Redis). The
-- version that ordered two writers' projections, and the count that told the reply statement whether
-- the conversation was waiting, serve nothing now. Dropping a column changes only the catalogue.
alter table conversations drop column version;
alter table conversations drop column answered_count;
