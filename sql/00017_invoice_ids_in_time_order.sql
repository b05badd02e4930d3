-- Invoices get UUIDv7 ids: the time in milliseconds first, then random bits (RFC 9562; Postgres 18
-- has uuidv7(), 15 does not). A run inserts thousands of invoices a statement; with random ids every
-- one lands on a random page of the invoices' key and of the invoice lines' key, which costs more
-- the larger those indexes grow (measured alone: 10 to 12 us of Postgres CPU a row of invoice and
-- line as the tables grew to a million, against 7.4 us flat in time order; bench/notes.md). Ids in
-- time order land on the last pages. Purchase invoices get them too, from the column's default.
create function uuid_v7() returns uuid
language sql volatile parallel safe
as $$
  -- The 48-bit Unix time in ms over the first 6 bytes of a random UUID, then version 7 (0111): a v4
  -- has 0100 in that nibble, and bits 52 and 53 (set_bit counts from each byte's low bit) make it 7.
  select encode(
    set_bit(set_bit(
      overlay(uuid_send(gen_random_uuid())
        placing substring(int8send(floor(extract(epoch from clock_timestamp()) * 1000)::bigint) from 3)
        from 1 for 6),
      52, 1), 53, 1),
    'hex')::uuid
$$;

alter table invoices alter column id set default uuid_v7();
