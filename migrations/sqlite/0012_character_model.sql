-- Per-character overrides of the generation loop's model settings (issue 15).
ALTER TABLE characters ADD COLUMN model TEXT;
ALTER TABLE characters ADD COLUMN temperature REAL;
ALTER TABLE characters ADD COLUMN system_prompt TEXT;
