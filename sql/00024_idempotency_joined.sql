-- A repeat of an actor command still in flight sends the command again under the first request's
-- reservation (same command id). Should the first then be refused (its rate limit, say) it freed the
-- key, so the repeat's answer was stored nowhere and the next repeat made a new reservation and sent
-- the command anew, applied a second time. A repeat that joins now marks the reservation, and the
-- first, refused, leaves a marked one to the requests that joined it.
alter table idempotency_keys add column joined boolean not null default false;
