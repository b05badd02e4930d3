-- World chat pages by time (`before`: strictly older), so the messages that share a page's last
-- millisecond were skipped by the next page; in a busy moment many do (80 sent at once shared 29
-- times). Like a conversation's messages, each is now at least a millisecond after the one before,
-- taken from this one-row clock in a statement of its own (its row lock lasts that statement, not
-- the post's transaction: a stalled post holds up no other).
create table chat_clock (
  only_row boolean primary key default true check (only_row),
  last_at timestamptz not null
);
insert into chat_clock (last_at) select coalesce(max(created_at), '-infinity') from chat_messages;
