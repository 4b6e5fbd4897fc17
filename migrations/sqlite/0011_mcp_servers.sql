-- MCP servers (`/mcp/servers`), scoped to an account. `config_json` is the
-- configuration without its secrets; `secrets` is the stdio `env` or http
-- `headers` map as JSON sealed with the server's secrets key (XChaCha20-Poly1305:
-- 24-byte nonce, then ciphertext and tag), NULL when the map is empty.
CREATE TABLE mcp_servers (
    id           TEXT PRIMARY KEY NOT NULL,
    account_id   TEXT NOT NULL REFERENCES accounts(id) ON DELETE CASCADE,
    name         TEXT NOT NULL,
    enabled      INTEGER NOT NULL DEFAULT 1,
    config_json  TEXT NOT NULL,
    secrets      BLOB,
    created_at   INTEGER NOT NULL,
    updated_at   INTEGER NOT NULL,
    UNIQUE (account_id, name)
);
CREATE INDEX mcp_servers_by_account ON mcp_servers (account_id, created_at);
CREATE INDEX mcp_servers_enabled ON mcp_servers (enabled, created_at);

-- The last tool list each server answered, so that its tools can be offered
-- (`catalog_source: cached`) while it is down, also after a restart.
CREATE TABLE mcp_tool_snapshots (
    server_id    TEXT PRIMARY KEY NOT NULL REFERENCES mcp_servers(id) ON DELETE CASCADE,
    tools_json   TEXT NOT NULL,
    snapshot_at  INTEGER NOT NULL
);
