-- Each reservation of an Idempotency-Key for an actor command or a proxy call gets an id of its own,
-- and the command id sent on is derived from it. A key used again after the 24 h window, or after a
-- refusal freed it, is then a new command; before this the actor, which remembers applied commands
-- for 48 h, answered it with the old result. Null for reservations made before (their command id
-- stays what it was).
alter table idempotency_keys add column reservation uuid;
