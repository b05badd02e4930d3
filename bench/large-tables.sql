-- Production-like table sizes, to see which plans PostgreSQL picks when the tables are large
-- (bench/notes.md, "Every query's plan at production sizes"). Run on a migrated, empty database:
--
--   createdb bigdata_x && DATABASE_URL=postgres://.../bigdata_x npm run migrate
--   psql -d bigdata_x -f bench/large-tables.sql        # about 5 minutes, 2.5 GB
--
-- then point the service at it and drive its routes with auto_explain loaded (`alter database
-- bigdata_x set session_preload_libraries = 'auto_explain'`, `auto_explain.log_min_duration = 0`,
-- `auto_explain.log_analyze = on`) or pg_stat_statements. Ids are md5 of a tag and a number
-- (agent j is md5('a' || j)::uuid, user i md5('u' || i)::uuid, provider id `seed-user-<i>`), so a
-- driver can find the heavy rows: user 1 owns agents 1 to 5,000; agent 1 has 200,000 subscribers
-- (users 2 to 200,001), 20,000 posts, 50,000 reviews and 1,000 config listings; user 2 has 5,000
-- subscriptions more and 200,000 messages with agent 1; user 1's organization 50,000 context entries.
\timing on
set synchronous_commit = off;
create or replace function pg_temp.u(t text) returns uuid language sql immutable as $$ select md5(t)::uuid $$;
create or replace function pg_temp.h(n bigint) returns bigint language sql immutable as $$ select ('x' || substr(md5(n::text), 1, 8))::bit(32)::bigint $$;

insert into users (id, provider_id, email, created_at)
select pg_temp.u('u' || i), 'seed-user-' || i, 'user' || i || '@example.com', now() - interval '500 days' + i * interval '1 minute'
from generate_series(1, 250000) i;

-- agents 1..5000 belong to user 1; the rest spread over users 2..20000
insert into participants (id, owner_id, name, display_name, description, blog_enabled, blog_auto_publish, created_at, updated_at)
select pg_temp.u('a' || j), pg_temp.u('u' || case when j <= 5000 then 1 else 2 + j % 19999 end), 'agent-' || j, 'Agent ' || j,
  'An agent', j % 2 = 0 or j = 1, false, now() - interval '400 days' + j * interval '10 seconds', now() - interval '400 days'
from generate_series(1, 50000) j;

insert into plans (id, participant_id, name, monthly_price_cents, included_proxy_calls, overage_per_call_cents, created_at, updated_at)
select pg_temp.u('p' || j), pg_temp.u('a' || j), 'Plan ' || j, 900, 1000, 1, now() - interval '400 days', now() - interval '400 days'
from generate_series(1, 50000) j;
insert into plan_terms (plan_id, effective_from, monthly_price_cents, included_proxy_calls, overage_per_call_cents)
select id, created_at, monthly_price_cents, included_proxy_calls, overage_per_call_cents from plans;

-- set A: agent 1's 200,000 subscribers (users 2..200001); set B: 300,000 pairs; set C: user 2 to agents 2..5001
create temp table seed_subs as
select pg_temp.u('sa' || i) as id, pg_temp.u('u' || i) as user_id, pg_temp.u('a1') as participant_id, pg_temp.u('p1') as plan_id,
  i % 20 = 0 as cancelled, now() - (pg_temp.h(i) % (45 * 1440)) * interval '1 minute' as started_at
from generate_series(2, 200001) i
union all
select pg_temp.u('sb' || k), pg_temp.u('u' || (2 + k % 249999)), pg_temp.u('a' || (2 + k % 49999)), pg_temp.u('p' || (2 + k % 49999)),
  k % 10 = 0, now() - (pg_temp.h(k + 1000000) % (45 * 1440)) * interval '1 minute'
from generate_series(1, 300000) k where 2 + k % 249999 <> 2
union all
select pg_temp.u('sc' || j), pg_temp.u('u2'), pg_temp.u('a' || j), pg_temp.u('p' || j), false, now() - (j % 40) * interval '1 day'
from generate_series(2, 5001) j;

insert into subscriptions (id, user_id, participant_id, plan_id, status, started_at, cancelled_at, created_at)
select id, user_id, participant_id, plan_id, case when cancelled then 'cancelled' else 'active' end, started_at,
  case when cancelled then started_at + (now() - started_at) / 2 end, started_at
from seed_subs;

insert into subscription_periods (subscription_id, period_index, period_start, period_end, monthly_price_cents, included_proxy_calls, overage_per_call_cents)
select s.id, k, s.started_at + make_interval(months => k), s.started_at + make_interval(months => k + 1), 900, 1000, 1
from subscriptions s cross join lateral generate_series(0, 3) k
where s.started_at + make_interval(months => k) <= coalesce(s.cancelled_at, now());

-- usage: 600,000 events on agent 1's subscriptions, 400,000 on the others', in period 0
insert into usage_events (id, subscription_id, period_index, occurred_at, counted_at)
select gen_random_uuid(), sp.subscription_id, 0, t.at, t.at
from (
  select n, case when n <= 600000 then pg_temp.u('sa' || (2 + n % 200000)) else pg_temp.u('sb' || (1 + n % 299999)) end as sid
  from generate_series(1, 1000000) n
) e
join subscription_periods sp on sp.subscription_id = e.sid and sp.period_index = 0
cross join lateral (select least(now() - interval '1 minute', sp.period_start + (pg_temp.h(e.n) % 1000) / 1000.0 * (sp.period_end - sp.period_start)) as at) t;
update subscription_periods sp set proxy_calls = c.n from (
  select subscription_id, period_index, count(*) as n from usage_events group by 1, 2
) c where c.subscription_id = sp.subscription_id and c.period_index = sp.period_index;

-- invoices for every period that ended more than two hours ago (the rest are due)
create temp table seed_inv as
select uuid_v7() as id, row_number() over (order by sp.period_end, sp.subscription_id) as number, s.user_id, s.participant_id,
  sp.subscription_id, sp.period_index, sp.period_start, sp.period_end,
  900 + greatest(0, sp.proxy_calls - 1000) as total_cents, sp.period_end + interval '10 minutes' as issued_at
from subscription_periods sp join subscriptions s on s.id = sp.subscription_id
where sp.period_end <= now() - interval '2 hours';
insert into invoices (id, number, user_id, participant_id, subscription_id, period_index, period_start, period_end, total_cents, issued_at)
select id, number, user_id, participant_id, subscription_id, period_index, period_start, period_end, total_cents, issued_at from seed_inv;
insert into invoice_lines (invoice_id, line_number, kind, description, quantity, unit_price_cents, amount_cents)
select id, 1, 'subscription', 'Plan', 1, 900, 900 from seed_inv;
update subscription_periods sp set invoice_id = i.id from seed_inv i
where i.subscription_id = sp.subscription_id and i.period_index = sp.period_index;

-- configs: agent 1 has 1,000 listings; 50,000 purchases, each with its invoice
insert into config_listings (id, participant_id, name, price_cents, file_type, content, preview_snippet, created_at, updated_at)
select pg_temp.u('cl' || n), pg_temp.u('a' || case when n <= 1000 then 1 else 2 + n % 49999 end), 'Config ' || n, 300, '.cursorrules',
  'Be brief.', 'Be', now() - interval '300 days' + n * interval '1 minute', now() - interval '300 days'
from generate_series(1, 20000) n;
create temp table seed_buy as
select pg_temp.u('cp' || n) as id, pg_temp.u('cl' || (1 + n % 20000)) as config_id, pg_temp.u('u' || (2 + n % 249999)) as user_id,
  now() - (n % 200) * interval '1 day' - n * interval '1 second' as at, uuid_v7() as invoice_id,
  (select max(number) from seed_inv) + n as number
from generate_series(1, 50000) n;
insert into config_purchases (id, config_id, user_id, price_cents, purchased_at)
select id, config_id, user_id, 300, at from seed_buy;
insert into invoices (id, number, user_id, participant_id, purchase_id, total_cents, issued_at)
select b.id_inv, b.number, b.user_id, c.participant_id, b.id, 300, b.at
from (select invoice_id as id_inv, * from seed_buy) b join config_listings c on c.id = b.config_id;
insert into invoice_lines (invoice_id, line_number, kind, description, quantity, unit_price_cents, amount_cents)
select invoice_id, 1, 'config_purchase', 'Config', 1, 300, 300 from seed_buy;
update config_purchases p set invoice_id = b.invoice_id from seed_buy b where b.id = p.id;
update invoice_counter set next_number = (select max(number) + 1 from invoices);

-- conversations: one per subscription; 1 % wait for a reply
insert into conversations (participant_id, user_id, latest_user_message, latest_user_message_at, latest_reply_at, pending_count, version)
select participant_id, user_id, 'How are you?', started_at + interval '1 hour 2 minutes',
  started_at + interval '1 hour' + case when waits then interval '1 minute' else interval '3 minutes' end,
  case when waits then 1 else 0 end, 4
from (select *, pg_temp.h(abs(hashtext(id::text))) % 100 = 0 as waits from seed_subs) s
on conflict do nothing;

-- messages: 4 a conversation (3 where it waits), and 200,000 in agent 1's conversation with user 2
insert into messages (id, participant_id, user_id, role, text, created_at)
select gen_random_uuid(), c.participant_id, c.user_id, case when m % 2 = 1 then 'user' else 'agent' end, 'Message ' || m,
  c.latest_user_message_at - interval '2 minutes' + (m - 1) * interval '1 minute'
from conversations c cross join lateral generate_series(1, case when c.pending_count > 0 then 3 else 4 end) m;
insert into messages (id, participant_id, user_id, role, text, created_at)
select gen_random_uuid(), pg_temp.u('a1'), pg_temp.u('u2'), case when m % 2 = 1 then 'user' else 'agent' end, 'Long talk ' || m,
  now() - interval '30 days' + m * interval '10 seconds'
from generate_series(1, 200000) m;
update conversations set latest_user_message_at = now() - interval '30 days' + 199999 * interval '10 seconds',
  latest_reply_at = now() - interval '30 days' + 200000 * interval '10 seconds', pending_count = 0
where participant_id = pg_temp.u('a1') and user_id = pg_temp.u('u2');

-- service requests: a third to agent 1; about 100 open, about 1,000 open but past their 24 h
insert into service_requests (id, from_participant_id, target_participant_id, service_tag, input, status, output, success, created_at, expires_at, responded_at)
select pg_temp.u('sr' || r), pg_temp.u('a' || (2 + r % 49999)), pg_temp.u('a' || case when r % 3 = 0 then 1 else 2 + (r * 7) % 49999 end),
  'tag' || (r % 10), 'Do something ' || r,
  case when open then 'pending' when at > now() - interval '24 hours' or r % 10 < 7 then 'completed' when r % 10 = 7 then 'failed' else 'expired' end,
  case when open or (at <= now() - interval '24 hours' and r % 10 >= 8) then null else 'Done' end,
  case when open or (at <= now() - interval '24 hours' and r % 10 >= 8) then null else r % 10 <> 7 end,
  at, at + interval '24 hours',
  case when open or (at <= now() - interval '24 hours' and r % 10 >= 8) then null else at + interval '1 minute' end
from generate_series(1, 300000) r
cross join lateral (select now() - (pg_temp.h(r) % (30 * 1440)) * interval '1 minute' - interval '30 seconds' as at) t
cross join lateral (select (t.at > now() - interval '24 hours' and r % 100 = 0) or (t.at <= now() - interval '24 hours' and r % 300 = 1) as open) o;

insert into actor_applied (actor, command_id, entry_id, request_hash, result, applied_at)
select 'agent:' || pg_temp.u('a' || (1 + n % 50000)), md5('c' || n), '1-' || n, null, '{"ok":true}', now() - (n % (72 * 60)) * interval '1 minute'
from generate_series(1, 1000000) n;

insert into outbox (user_id, type, data)
select pg_temp.u('u' || (1 + n % 250000)), 'conversation.reply',
  json_build_object('type', 'conversation.reply', 'createdAt', now(), 'participantId', pg_temp.u('a1'), 'messageId', gen_random_uuid(), 'text', 'Hi')::text
from generate_series(1, 100000) n;

-- blog: a fifth of 100,000 posts are agent 1's; 10 % drafts, 10 % scheduled
insert into blog_posts (id, participant_id, title, slug, content, content_html, excerpt, tags, status, publish_at, published_at, first_published_at, created_at, updated_at)
select pg_temp.u('b' || n), pg_temp.u('a' || case when n % 5 = 0 then 1 else 2 + 2 * (n % 24999) end),
  'Post ' || n, 'post-' || n, 'Content of post ' || n, '<p>Content of post ' || n || '</p>', null,
  array['tag' || (n % 50), 'topic' || (n % 7)],
  case n % 10 when 0 then 'draft' when 1 then 'scheduled' else 'published' end,
  case when n % 10 = 1 then now() + (case when n % 1000 = 1 then -1 else 1 end) * n * interval '1 minute' end,
  case when n % 10 > 1 then now() - n * interval '1 minute' end,
  case when n % 10 > 1 then now() - n * interval '1 minute' end,
  now() - n * interval '1 minute' - interval '1 minute', now() - n * interval '1 minute'
from generate_series(1, 100000) n;
insert into blog_reactions (post_id, user_id, type, created_at)
select pg_temp.u('b' || (1 + n % 100000)), pg_temp.u('u' || (1 + n % 250000)), (array['like', 'insightful', 'helpful'])[1 + n % 3], now()
from generate_series(1, 200000) n
on conflict do nothing;

insert into chat_messages (author_kind, author_id, author_name, text, created_at)
select 'user', pg_temp.u('u' || (1 + n % 250000)), 'user' || n, 'Hello world ' || n, now() - n * interval '1 second'
from generate_series(1, 1000000) n;
update chat_clock set last_at = (select max(created_at) from chat_messages);

insert into api_keys (kind, participant_id, name, prefix, key_hash, created_at)
select 'agent', pg_temp.u('a' || j), 'default', 'sk_agt_' || substr(md5('k' || j), 1, 5), sha256(('ka' || j)::bytea), now() - interval '300 days'
from generate_series(1, 50000) j;
insert into api_keys (kind, user_id, name, prefix, key_hash, created_at, revoked_at)
select 'user', pg_temp.u('u' || case when n <= 1000 then 2 else 1 + n % 20000 end), 'key ' || n, 'sk_usr_' || substr(md5('k' || n), 1, 5),
  sha256(('ku' || n)::bytea), now() - n * interval '1 minute', case when n % 20 = 0 then now() end
from generate_series(1, 50000) n;

insert into device_codes (device_code, device_code_hash, user_code, status, user_id, created_at, expires_at, decided_at, delivered_at)
select null, sha256(('dc' || n)::bytea), translate(upper(substr(md5('d' || n), 1, 8)), '0123456789AEIOUY', 'BCDFGHJKLMNPQRST'),
  case when n % 1000 = 0 then 'pending' else 'delivered' end,
  case when n % 1000 = 0 then null else pg_temp.u('u' || (1 + n % 250000)) end,
  now() - (n % 14400) * interval '1 minute', now() - (n % 14400) * interval '1 minute' + interval '15 minutes',
  case when n % 1000 = 0 then null else now() - (n % 14400) * interval '1 minute' end,
  case when n % 1000 = 0 then null else now() - (n % 14400) * interval '1 minute' end
from generate_series(1, 50000) n
on conflict do nothing;

insert into idempotency_keys (subject, key, request_hash, response_status, response_body, created_at)
select 'user:' || pg_temp.u('u' || (1 + n % 250000)), 'key-' || n, sha256(n::text::bytea), 201, '{"success":true}', now() - (n % 2880) * interval '1 minute'
from generate_series(1, 500000) n;

insert into organizations (id, user_id, created_at)
select pg_temp.u('o' || i), pg_temp.u('u' || i), now() - interval '100 days' from generate_series(1, 20000) i;
insert into context_entries (org_id, type, key, version, data, confidence, author_kind, author_id, created_at)
select pg_temp.u('o1'), (array['brand','audience','tone','products','competitors','keywords','goals','preferences','team','content_insights','custom'])[1 + n % 11],
  'key-' || (n % 1000), 1 + n / 11000, '{"v":1}', 'derived', 'agent', pg_temp.u('a1'), now() - interval '50 days' + n * interval '1 minute'
from generate_series(1, 50000) n;
insert into context_entries (org_id, type, key, version, data, confidence, author_kind, author_id, created_at)
select pg_temp.u('o' || (2 + n % 19999)), (array['brand','audience','tone','products','competitors','keywords','goals','preferences','team','content_insights','custom'])[1 + n % 11],
  'k' || (n % 13), 1, '{"v":1}', 'user_provided', 'user', pg_temp.u('u1'), now() - interval '50 days' + n * interval '1 second'
from generate_series(1, 150000) n
on conflict do nothing;

insert into reviews (id, participant_id, user_id, rating, comment, created_at, updated_at)
select gen_random_uuid(), pg_temp.u('a' || case when n <= 50000 then 1 else 2 + n % 49999 end), pg_temp.u('u' || (1 + n)), 1 + n % 5, 'Fine',
  now() - n * interval '1 minute', now() - n * interval '1 minute'
from generate_series(1, 100000) n;
update participants a set rating_sum = r.s, rating_count = r.c from (
  select participant_id, sum(rating) s, count(*) c from reviews group by 1
) r where r.participant_id = a.id;
update participants a set active_subscribers = s.c from (
  select participant_id, count(*) c from subscriptions where status = 'active' group by 1
) s where s.participant_id = a.id;

insert into connections (user_id, provider, base_url, label, credential, created_at)
select pg_temp.u('u' || n), 'openai', 'https://api.openai.com', 'main', sha256(n::text::bytea) || sha256(n::text::bytea), now()
from generate_series(1, 20000) n;

insert into usage_uncounted (id, subscription_id, period_index, occurred_at)
select gen_random_uuid(), sp.subscription_id, sp.period_index, now() - interval '5 minutes'
from subscription_periods sp where sp.invoice_id is null and sp.period_end > now() limit 2000;

insert into actor_fences (actor, token, last_at)
select 'agent:' || pg_temp.u('a' || j), 1, now() - interval '1 day' from generate_series(1, 50000) j;

analyze;
