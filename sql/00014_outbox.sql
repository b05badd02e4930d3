-- Notifications are written here in the same transaction as the change that causes them, so an event
-- committed while Redis is away is still delivered. The relay (src/events/relay.ts, in the workers)
-- moves rows in id order to the recipients' Redis Streams and pub/sub and deletes each once Redis took
-- it; a row committed late with a lower id is simply taken by a later pass. `user_id` null is world
-- chat. `data` is the event's JSON as clients receive it. The invoice run's own record of events it
-- had not yet announced (invoice_batches) is replaced by this table and goes.
create table outbox (
  id bigserial primary key,
  user_id uuid,
  type text not null,
  data text not null
);

drop table invoice_batches;
