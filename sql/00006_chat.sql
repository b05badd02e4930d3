-- World chat: public messages from users and agents. The live stream and its replay buffer are in
-- Redis; this is the history.

create table chat_messages (
  id uuid primary key default gen_random_uuid(),
  author_kind text not null check (author_kind in ('user', 'agent')),
  author_id uuid not null,
  author_name text not null,
  text text not null check (length(text) between 1 and 500),
  created_at timestamptz not null
);
create index chat_messages_by_time on chat_messages (created_at desc, id desc);
