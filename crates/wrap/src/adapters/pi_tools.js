// Pi has no MCP client: this extension gives it Steadfast's journaled sandbox tools by
// calling the session's MCP server (streamable HTTP, JSON-RPC) for the tool list and
// for every call. Loaded with `pi -e`; the server's URL is in STEADFAST_MCP_URL.
const MCP = process.env.STEADFAST_MCP_URL;
let nextId = 1;

async function rpc(method, params) {
  const response = await fetch(MCP, {
    method: "POST",
    headers: { "content-type": "application/json", accept: "application/json, text/event-stream" },
    body: JSON.stringify({ jsonrpc: "2.0", id: nextId++, method, params }),
  });
  const text = await response.text();
  // The answer is JSON, or server-sent events whose last data line holds it.
  const body = text.trimStart().startsWith("{")
    ? text
    : text.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trim()).filter(Boolean).pop();
  const message = JSON.parse(body);
  if (message.error) throw new Error(`${method}: ${message.error.message}`);
  return message.result;
}

export default async function (pi) {
  await rpc("initialize", {
    protocolVersion: "2025-03-26",
    capabilities: {},
    clientInfo: { name: "pi-steadfast-tools", version: "1" },
  });
  const { tools } = await rpc("tools/list", {});
  for (const tool of tools) {
    pi.registerTool({
      name: tool.name,
      label: tool.name,
      description: tool.description,
      parameters: tool.inputSchema,
      async execute(_toolCallId, params) {
        const result = await rpc("tools/call", { name: tool.name, arguments: params });
        const text = (result.content || []).map((c) => c.text || "").join("\n");
        if (result.isError) throw new Error(text);
        return { content: [{ type: "text", text }], details: {} };
      },
    });
  }
}
