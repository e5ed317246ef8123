"""Calls the gateway with the official Anthropic and OpenAI Python SDKs, streaming and
not, and prints what each SDK parsed (text, tool calls with ids and inputs) as JSON, so
a live run and a replayed run can be compared."""

import json
import sys

import anthropic
import openai

base, token = sys.argv[1], sys.argv[2]
tools_anthropic = [{"name": "bash", "description": "run a command",
                    "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}}]
tools_chat = [{"type": "function", "function": {"name": "bash", "description": "run a command",
                                                 "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}}]
tools_responses = [{"type": "function", "name": "bash", "description": "run a command",
                    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}]
out = {}

a = anthropic.Anthropic(base_url=base, api_key=token, max_retries=0)
msg = a.messages.create(model="claude-sonnet-4-5", max_tokens=256, tools=tools_anthropic,
                        messages=[{"role": "user", "content": "list the files"}])
out["anthropic"] = [b.model_dump() for b in msg.content] + [msg.id, msg.stop_reason]
with a.messages.stream(model="claude-sonnet-4-5", max_tokens=256, tools=tools_anthropic,
                       messages=[{"role": "user", "content": "list the files, streaming"}]) as s:
    text = "".join(s.text_stream)
    final = s.get_final_message()
out["anthropic_stream"] = [text] + [b.model_dump() for b in final.content] + [final.id, final.stop_reason]
out["count_tokens"] = a.messages.count_tokens(
    model="claude-sonnet-4-5", messages=[{"role": "user", "content": "count me"}]).input_tokens

o = openai.OpenAI(base_url=base + "/v1", api_key=token, max_retries=0)
chat = o.chat.completions.create(model="gpt-5", tools=tools_chat,
                                 messages=[{"role": "user", "content": "list the files"}])
m = chat.choices[0].message
out["chat"] = [m.content, [(t.id, t.function.name, json.loads(t.function.arguments)) for t in m.tool_calls], chat.id]
calls, text = {}, ""
for chunk in o.chat.completions.create(model="gpt-5", tools=tools_chat, stream=True,
                                       messages=[{"role": "user", "content": "list the files, streaming"}]):
    if not chunk.choices:
        continue
    d = chunk.choices[0].delta
    text += d.content or ""
    for t in d.tool_calls or []:
        c = calls.setdefault(t.index, {"id": t.id, "name": None, "args": ""})
        c["id"] = c["id"] or t.id
        c["name"] = c["name"] or (t.function.name if t.function else None)
        c["args"] += (t.function.arguments or "") if t.function else ""
out["chat_stream"] = [text, [(c["id"], c["name"], json.loads(c["args"])) for c in calls.values()]]

r = o.responses.create(model="gpt-5", tools=tools_responses, input="list the files")
out["responses"] = [r.output_text, [(i.call_id, i.name, json.loads(i.arguments)) for i in r.output if i.type == "function_call"], r.id]
with o.responses.stream(model="gpt-5", tools=tools_responses, input="list the files, streaming") as s:
    deltas = "".join(e.delta for e in s if e.type == "response.output_text.delta")
    final = s.get_final_response()
out["responses_stream"] = [deltas, [(i.call_id, i.name, json.loads(i.arguments)) for i in final.output if i.type == "function_call"], final.id]
print(json.dumps(out, sort_keys=True))
