-- The worker id (the poller's `Anthropic-Worker-ID` header or `worker_id`
-- query parameter) that made the item's current or last claim, so an
-- operator can tell which worker holds it. NULL for a claim whose poller
-- named no worker, and for items claimed before this column. The api
-- refuses longer or non-printable ids before they reach this table.
ALTER TABLE work ADD COLUMN worker_id text
    CHECK (char_length(worker_id) BETWEEN 1 AND 256);
