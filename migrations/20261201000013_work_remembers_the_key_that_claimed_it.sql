-- The Environment key whose Poll made the current claim. A supervisor may
-- read where the items its key claimed stand (`GET …/work/claims`, Mango's
-- narrow extension of what an Environment key may do): whether their Work
-- stopped or another claim took them, so it removes their sandboxes.
ALTER TABLE work ADD COLUMN claimed_by text REFERENCES api_keys(id) ON DELETE SET NULL;
