-- migrate: no-transaction lock-timeout=0 statement-timeout=0
-- Every subscription of an agent, cancelled ones included: creator stats count the calls of the
-- month over all of them (a subscription cancelled this month had calls in it), and the only index
-- by agent held the active ones, so each of the owner's agents cost a sequential scan of every
-- subscription of the marketplace. An owner of 10,000 agents among 120,000 subscriptions had its
-- stats cancelled by the 30 s statement timeout (503) every time; with this index, 3.2 s, nearly all
-- of it counting one agent's 2,000,000 calls of the month.
drop index concurrently if exists subscriptions_by_agent;
create index concurrently subscriptions_by_agent on subscriptions (participant_id);
