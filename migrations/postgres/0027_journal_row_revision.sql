-- Every statement that changes a journal row bumps its revision, so that the
-- row's JSON written once for a page is reused while the row is unchanged
-- (src/store/rendered_rows.rs, issue 20).
ALTER TABLE tool_execution_record ADD COLUMN revision BIGINT NOT NULL DEFAULT 0;
