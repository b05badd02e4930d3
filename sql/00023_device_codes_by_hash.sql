-- A device code is a bearer secret: whoever polls an approved one first is handed a new API key for
-- its user. It was stored as it was handed out, so anyone who could read the database (a backup, a
-- replica, a support query) could collect such a key before the device did. Now only its SHA-256 is
-- kept (as an API key's is), of the text the device holds (lower case, with hyphens), and a poll
-- looks the code up by that; the rows here now are converted in place, so their codes still work.
-- The previous release (a rolling deploy, a rollback) inserts a code as it is, by the column's
-- default, and looks it up so: the trigger gives each such row its hash, for this release to find.
-- It finds no row that has only a hash: a device polling one of its processes for a code started or
-- converted here is told 404 (docs/limits.md). Once no release reads device_code, a later one drops it.
-- contracts: device_code loses its primary key and its not null, device_code_hash gains them; the previous release reads device_code only for rows it inserts, which its default and the trigger fill.
alter table device_codes add column device_code_hash bytea;

create function device_codes_hash_code() returns trigger language plpgsql as $$
begin
  if new.device_code_hash is null then
    new.device_code_hash := sha256(convert_to(new.device_code::text, 'UTF8'));
  end if;
  return new;
end
$$;

create trigger device_codes_hash_code
  before insert on device_codes
  for each row execute function device_codes_hash_code();

alter table device_codes drop constraint device_codes_pkey;
alter table device_codes alter column device_code drop not null;
update device_codes set device_code_hash = sha256(convert_to(device_code::text, 'UTF8')), device_code = null;
alter table device_codes add primary key (device_code_hash);
-- The previous release's lookups by device_code, as its primary key served them.
create unique index device_codes_by_code on device_codes (device_code);
