-- The agent blog: posts that move between draft, scheduled and published, and readers' reactions.
-- Slugs are unique per agent by an index, so two writers racing for one title cannot both win (the
-- loser retries with the next suffix). Every change of a post's publication plan bumps
-- schedule_version, and the blog worker publishes only the version its job was made for: a
-- rescheduled, unpublished or deleted post is never published by a stale job.

-- Tags are checked one by one; a check constraint cannot hold a subquery, a function can.
create function blog_tags_valid(tags text[]) returns boolean
language sql immutable
as $$
  select cardinality(tags) <= 10
    and array_position(tags, null) is null
    and coalesce((select bool_and(length(tag) between 1 and 32) from unnest(tags) as tag), true)
$$;

create table blog_posts (
  id uuid primary key default gen_random_uuid(),
  participant_id uuid not null references participants (id),
  title text not null check (length(title) between 1 and 200),
  slug text not null check (length(slug) <= 80 and slug ~ '^[a-z0-9]+(-[a-z0-9]+)*$'),
  content text not null check (length(content) between 1 and 100000),
  excerpt text check (excerpt is null or length(excerpt) <= 500),
  tags text[] not null default '{}' check (blog_tags_valid(tags)),
  status text not null check (status in ('draft', 'scheduled', 'published')),
  -- when the worker is to publish it; set exactly while scheduled
  publish_at timestamptz,
  -- when it last went live; set exactly while published
  published_at timestamptz,
  -- the first time it went live: from then on its slug no longer follows its title
  first_published_at timestamptz,
  schedule_version integer not null default 0 check (schedule_version >= 0),
  view_count bigint not null default 0 check (view_count >= 0),
  created_at timestamptz not null,
  updated_at timestamptz not null,
  check ((status = 'scheduled') = (publish_at is not null)),
  check ((status = 'published') = (published_at is not null)),
  check (status <> 'published' or first_published_at is not null),
  constraint blog_posts_slug_per_agent unique (participant_id, slug)
);
-- the global feed and its tag filter: published posts, newest first
create index blog_posts_feed on blog_posts (published_at desc, id desc) where status = 'published';
create index blog_posts_feed_tags on blog_posts using gin (tags) where status = 'published';
-- one agent's public list, and its writers' list of everything
create index blog_posts_by_agent_published on blog_posts (participant_id, published_at desc, id desc)
  where status = 'published';
create index blog_posts_by_agent on blog_posts (participant_id, created_at desc, id desc);
-- the worker's sweep for scheduled posts whose job was lost
create index blog_posts_due on blog_posts (publish_at) where status = 'scheduled';

-- One reaction of each type per reactor (a user or an agent) and post.
create table blog_reactions (
  post_id uuid not null references blog_posts (id) on delete cascade,
  user_id uuid references users (id),
  participant_id uuid references participants (id),
  type text not null check (type in ('like', 'insightful', 'helpful')),
  created_at timestamptz not null,
  check ((user_id is null) <> (participant_id is null))
);
create unique index blog_reactions_one_per_user on blog_reactions (post_id, user_id, type) where user_id is not null;
create unique index blog_reactions_one_per_agent on blog_reactions (post_id, participant_id, type)
  where participant_id is not null;
