// An accounts-payable agent on the OpenAI Node SDK (Chat Completions) with two local tools.
// No plumbline code and no tracing: the SDK takes its base URL from OPENAI_BASE_URL.
import OpenAI from "openai";

const tools = ["lookup_invoice", "pay"].map((name) => ({
  type: "function",
  function: { name, description: `${name} by invoice id`, parameters: { type: "object", properties: { invoice_id: { type: "string" } } } },
}));
const run = { lookup_invoice: ({ invoice_id }) => ({ invoice_id, status: "open" }), pay: ({ invoice_id }) => ({ paid: invoice_id }) };

const chunks = [];
for await (const chunk of process.stdin) chunks.push(chunk);
const client = new OpenAI();
const messages = [{ role: "user", content: Buffer.concat(chunks).toString() }];
for (let turn = 0; turn < 8; turn++) {
  const reply = await client.chat.completions.create({ model: "gpt-4o-mini", messages, tools });
  const message = reply.choices[0].message;
  if (!message.tool_calls?.length) {
    console.log(JSON.stringify({ output: message.content }));
    process.exit(0);
  }
  messages.push(message);
  for (const call of message.tool_calls) {
    const result = run[call.function.name]?.(JSON.parse(call.function.arguments || "{}")) ?? { error: "no such tool" };
    messages.push({ role: "tool", tool_call_id: call.id, content: JSON.stringify(result) });
  }
}
process.exit(1);
