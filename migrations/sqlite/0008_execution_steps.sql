-- The generation step a call belongs to within its run, for the
-- max_steps_per_generation guard: `step:<n>` when the caller names the step
-- (parallel calls of one model round trip share it), NULL otherwise.
ALTER TABLE tool_execution_record ADD COLUMN step_key TEXT;
