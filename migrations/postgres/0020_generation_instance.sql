-- The instance whose generation loop drives a run (`generation = 'running'`):
-- at start-up only the runs of dead instances are interrupted ones. On a
-- shared database another, live instance may be generating. NULL for rows
-- written before this column (treated as interrupted, as before).
ALTER TABLE floor_runs ADD COLUMN generation_instance TEXT;
