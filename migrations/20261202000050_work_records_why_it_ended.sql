-- Why a Work item ended (or is ending): who first asked, and how. A
-- supervisor may keep the sandbox of an item its runner ended at the
-- Session's idle end ('idle'), and must remove every other (spec §7.1).
-- NULL while nobody has asked, and for items stopped before this column.
ALTER TABLE work ADD COLUMN end_reason text
    CHECK (end_reason IN ('idle', 'holder', 'operator', 'failed', 'result', 'lapsed'));
