"""Drives toolgate's /mcp/sessions/{id} endpoint with the official MCP Python SDK.

Usage: driver.py <url> <api key> <slot or "-">

Connects (initialize handshake), prints {"event": "ready", ...} (or
{"event": "failed", "error"} when the server refuses the connection), then reads one
JSON command per line from stdin and prints one JSON answer per line:

  {"op": "list"}                               -> {"tools": [{name, description, annotations, input_schema}]}
  {"op": "call", "name": N, "arguments": {..}} -> {"is_error", "text", "structured", "meta"}
  {"op": "wait_list_changed", "seen": K, "timeout": S}
                                               -> {"list_changed": n} once n > K, else {"error": "timeout"}
  {"op": "quit"}

A protocol error (JSON-RPC error) answers {"error": message}. The toolgate test
(tests/mcp_server.rs) starts this with the venv .ci/mcp-client creates.
"""

import json
import sys

import anyio
import mcp_types as types
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError


def emit(value):
    sys.stdout.write(json.dumps(value) + "\n")
    sys.stdout.flush()


class Notifications:
    def __init__(self):
        self.list_changed = 0
        self.changed = anyio.Event()

    async def handle(self, message):
        if isinstance(message, types.ToolListChangedNotification):
            self.list_changed += 1
            self.changed.set()
            self.changed = anyio.Event()

    async def wait_beyond(self, seen, timeout):
        with anyio.move_on_after(timeout):
            while self.list_changed <= seen:
                await self.changed.wait()
        if self.list_changed > seen:
            return {"list_changed": self.list_changed}
        return {"error": "timeout", "list_changed": self.list_changed}


def tool_json(tool):
    annotations = tool.annotations.model_dump(by_alias=True, exclude_none=True) if tool.annotations else None
    return {
        "name": tool.name,
        "description": tool.description,
        "annotations": annotations,
        "input_schema": tool.input_schema,
    }


def result_json(result):
    texts = [block.text for block in result.content if getattr(block, "type", None) == "text"]
    return {
        "is_error": bool(result.is_error),
        "text": "\n".join(texts),
        "structured": result.structured_content,
        "meta": result.meta,
    }


async def run_command(session, notifications, command):
    op = command["op"]
    try:
        if op == "list":
            listed = await session.list_tools()
            return {"tools": [tool_json(tool) for tool in listed.tools]}
        if op == "call":
            result = await session.call_tool(command["name"], command.get("arguments") or {})
            return result_json(result)
        if op == "wait_list_changed":
            return await notifications.wait_beyond(command.get("seen", 0), command.get("timeout", 30))
    except MCPError as error:
        return {"error": str(error)}
    return {"error": f"unknown op {op!r}"}


async def main():
    url, key, slot = sys.argv[1], sys.argv[2], sys.argv[3]
    headers = {"Authorization": f"Bearer {key}"}
    if slot != "-":
        headers["X-Toolgate-Slot"] = slot
    notifications = Notifications()
    stdin = anyio.wrap_file(sys.stdin)
    async with create_mcp_http_client(headers=headers) as http:
        async with streamable_http_client(url, http_client=http) as (read, write):
            async with ClientSession(read, write, message_handler=notifications.handle) as session:
                init = await session.initialize()
                emit({
                    "event": "ready",
                    "protocol_version": init.protocol_version,
                    "server": init.server_info.name,
                    "list_changed_capability": bool(init.capabilities.tools and init.capabilities.tools.list_changed),
                })
                async for line in stdin:
                    if not line.strip():
                        continue
                    command = json.loads(line)
                    if command["op"] == "quit":
                        break
                    emit(await run_command(session, notifications, command))


def failure_text(error):
    # anyio task groups wrap the transport's error; the innermost says why.
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    return f"{type(error).__name__}: {error}"


if __name__ == "__main__":
    try:
        anyio.run(main)
    except Exception as error:  # the connection was refused: say so, for the test
        emit({"event": "failed", "error": failure_text(error)})
        sys.exit(1)
