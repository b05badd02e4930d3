-- A key in progress (no response stored yet) is always a reservation of an actor command or a proxy
-- call, and every reservation has had an id since 00011: said here, so no code keeps a second way to
-- derive a command id for rows from before (none in any deployment; the service has never run
-- before this). Keys completed in one transaction (`idempotent`) need no reservation.
delete from idempotency_keys where reservation is null and response_status is null;
alter table idempotency_keys add constraint idempotency_keys_in_progress_reserved
  check (reservation is not null or response_status is not null);
