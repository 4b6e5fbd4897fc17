-- Why a call did not succeed, as a stable word from the ReasonCode table
-- (src/reason.rs); NULL on success and while a row is open. Rows written before
-- this column existed keep NULL: their reason was never recorded, and guessing
-- it from their messages would make the field untrustworthy.
ALTER TABLE tool_execution_record ADD COLUMN execution_reason_code TEXT;

-- A deferred call's delivered result carries the same code as its journal row.
ALTER TABLE session_deliveries ADD COLUMN execution_reason_code TEXT;
