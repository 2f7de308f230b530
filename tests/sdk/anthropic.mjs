// anthropic.mjs — the official @anthropic-ai/sdk package against k3c serve's Messages API (docs/SERVING.md "Client
// compatibility", §8): whole and streamed tool_use answers, the stream's events, the tool_result turn to the final
// answer, the SDK's tool runner (its message threads refused, so it sends the whole history), a system prompt, typed
// errors.
import {
    anthropic, load, ok, check, noControl, done, expectError, MODEL, CALCULATOR, QUESTION, ANSWER,
} from "./lib.mjs";

const client = anthropic();
const Anthropic = client.constructor;
const fn = CALCULATOR.function;
const TOOL = { name: fn.name, description: fn.description, input_schema: fn.parameters };
// max_tokens is the server's cap: the fixture's call is markup-heavy (its tokens count, its text does not)
const ask = { model: MODEL, max_tokens: 96, messages: [{ role: "user", content: QUESTION }], tools: [TOOL],
              temperature: 0 };
const CALL_ID = "toolu_1";
const afterResult = [
    { role: "user", content: QUESTION },
    { role: "assistant", content: [{ type: "tool_use", id: CALL_ID, name: "calculator",
                                     input: { expression: "6 * 7" } }] },
    { role: "user", content: [{ type: "tool_result", tool_use_id: CALL_ID, content: "42" }] },
];

function isCalculatorUse(b) {
    return b?.type === "tool_use" && b.name === "calculator" && typeof b.id === "string" && b.id.length > 0
        && typeof b.input === "object" && typeof b.input?.expression === "string";
}

function isUsage(u) {
    return Number.isInteger(u?.input_tokens) && u.input_tokens > 0 && Number.isInteger(u.output_tokens)
        && u.output_tokens > 0;
}

function calculate({ expression }) {
    const safe = expression.replace(/[^0-9+\-*/(). ]/g, "");
    return String(Function(`"use strict"; return (${safe})`)());
}

await check("whole tool_use", async () => {
    const m = await client.messages.create(ask);
    noControl(m, "whole tool_use");
    ok("whole tool_use: message object", m.type === "message" && m.role === "assistant" && m.id.startsWith("msg_")
        && m.model === MODEL, m);
    const uses = m.content.filter((b) => b.type === "tool_use");
    ok("whole tool_use: one calculator block", uses.length === 1 && isCalculatorUse(uses[0]), m.content);
    ok("whole tool_use: stop_reason tool_use", m.stop_reason === "tool_use" && m.stop_sequence === null, m);
    ok("whole tool_use: usage", isUsage(m.usage), m.usage);
});

await check("plain answer", async () => {
    const m = await client.messages.create({ ...ask, messages: afterResult });
    noControl(m, "plain answer");
    ok("plain answer: one text block", m.content.length === 1 && m.content[0].type === "text"
        && m.content[0].text === ANSWER, m.content);
    ok("plain answer: stop_reason end_turn", m.stop_reason === "end_turn" && m.stop_sequence === null, m);
    ok("plain answer: usage", isUsage(m.usage), m.usage);
});

await check("streamed tool_use", async () => {
    const stream = client.messages.stream(ask);
    const types = [], partial = [];
    let json = null;
    stream.on("streamEvent", (ev) => {
        noControl(ev, "stream event");
        types.push(ev.type);
        if (ev.type === "content_block_delta" && ev.delta.type === "input_json_delta") partial.push(ev.delta);
    });
    stream.on("inputJson", (_delta, snapshot) => (json = snapshot));
    const m = await stream.finalMessage();
    noControl(m, "streamed final");
    const uses = m.content.filter((b) => b.type === "tool_use");
    ok("streamed tool_use: assembled calculator block", uses.length === 1 && isCalculatorUse(uses[0]), m.content);
    ok("streamed tool_use: inputJson snapshot", json?.expression === uses[0]?.input?.expression, json);
    ok("streamed tool_use: stop_reason tool_use", m.stop_reason === "tool_use", m);
    ok("streamed tool_use: usage", isUsage(m.usage), m.usage);
    const order = ["message_start", "content_block_start", "content_block_delta", "content_block_stop",
                   "message_delta", "message_stop"];
    const at = order.map((t) => types.indexOf(t));
    ok("streamed tool_use: event types in order", at.every((i, k) => i >= 0 && (k === 0 || i > at[k - 1]))
        && types[0] === "message_start" && types.at(-1) === "message_stop", types);
    ok("streamed tool_use: input_json_delta", partial.length >= 1
        && partial.every((d) => typeof d.partial_json === "string"), partial);
});

await check("streamed plain answer", async () => {
    const stream = client.messages.stream({ ...ask, messages: afterResult });
    let text = "";
    stream.on("streamEvent", (ev) => noControl(ev, "stream event"));
    stream.on("text", (delta) => (text += delta));
    const m = await stream.finalMessage();
    noControl(m, "streamed plain final");
    ok("streamed plain answer: text", text === ANSWER && m.content[0]?.text === ANSWER, { text, m });
    ok("streamed plain answer: stop_reason end_turn", m.stop_reason === "end_turn", m);
});

await check("tool_result round trip", async () => {
    const first = await client.messages.create(ask);
    noControl(first, "round trip call");
    const use = first.content.find((b) => b.type === "tool_use");
    ok("tool_result round trip: the call", isCalculatorUse(use), first.content);
    const m = await client.messages.create({
        ...ask,
        messages: [
            { role: "user", content: QUESTION },
            { role: "assistant", content: first.content },
            { role: "user", content: [{ type: "tool_result", tool_use_id: use.id, content: calculate(use.input) }] },
        ],
    });
    noControl(m, "round trip answer");
    ok("tool_result round trip: final answer", m.content.at(-1)?.type === "text" && m.content.at(-1).text === ANSWER
        && m.stop_reason === "end_turn", m);
});

for (const streamed of [false, true]) {
    const name = `toolRunner${streamed ? " streamed" : ""}`;
    await check(name, async () => {
        const { betaTool } = load("@anthropic-ai/sdk/helpers/beta/json-schema");
        const seen = [];
        const calculator = betaTool({
            name: TOOL.name, description: TOOL.description, inputSchema: TOOL.input_schema,
            run: (input) => {
                seen.push(input.expression);
                return calculate(input);
            },
        });
        const runner = client.beta.messages.toolRunner({ ...ask, tools: [calculator], stream: streamed,
                                                         max_iterations: 4 });
        const messages = [];
        for await (const step of runner) {
            const m = streamed ? await step.finalMessage() : step;
            noControl(m, `${name} message`);
            messages.push(m);
        }
        const last = messages.at(-1);
        ok(`${name}: the tool ran`, seen.length >= 1 && seen.every((e) => calculate({ expression: e }) === "42"),
            seen);
        ok(`${name}: call then answer`, messages.length === 2 && messages[0].stop_reason === "tool_use"
            && last?.stop_reason === "end_turn" && last.content.at(-1)?.text === ANSWER, messages);
        const sent = runner.params.messages;
        ok(`${name}: the tool_result turn`, sent.some((m) => m.role === "user" && Array.isArray(m.content)
            && m.content.some((b) => b.type === "tool_result" && b.tool_use_id === messages[0].content.find(
                (c) => c.type === "tool_use")?.id)), sent);
    });
}

await check("system prompt", async () => {
    const m = await client.messages.create({ ...ask, system: "Use the calculator for arithmetic." });
    noControl(m, "system prompt");
    ok("system prompt: accepted", m.type === "message" && m.content.length >= 1 && isUsage(m.usage), m);
    const blocks = await client.messages.create({ ...ask, system: [{ type: "text", text: "Be brief." }],
                                                  messages: afterResult, max_tokens: 40 });
    noControl(blocks, "system blocks");
    ok("system prompt: as text blocks", blocks.type === "message" && isUsage(blocks.usage), blocks);
});

await check("thinking disabled", async () => {
    const m = await client.messages.create({ ...ask, messages: afterResult, thinking: { type: "disabled" } });
    noControl(m, "thinking disabled");
    ok("thinking disabled: no thinking block, the answer", m.content.every((b) => b.type !== "thinking")
        && m.content.at(-1)?.text === ANSWER, m.content);
});

// Anthropic's error body: {type: "error", error: {type, message}}
const expectAnthropicError = (name, cls, status, type, fn) => expectError(name, cls, status, fn,
    (b) => b?.type === "error" && b.error?.type === type && typeof b.error.message === "string"
        && b.error.message.length > 0);

await expectAnthropicError("404 unknown model is NotFoundError", Anthropic.NotFoundError, 404, "not_found_error",
    () => client.messages.create({ ...ask, model: "no-such-model" }));
await expectAnthropicError("400 bad value is BadRequestError", Anthropic.BadRequestError, 400, "invalid_request_error",
    () => client.messages.create({ ...ask, temperature: 7 }));
await expectAnthropicError("400 bad block is BadRequestError", Anthropic.BadRequestError, 400, "invalid_request_error",
    () => client.messages.create({ ...ask, messages: [{ role: "user", content: [{ type: "video" }] }] }));
await expectAnthropicError("401 wrong key is AuthenticationError", Anthropic.AuthenticationError, 401, "authentication_error",
    () => anthropic({ apiKey: "wrong-key" }).messages.create(ask));
await expectAnthropicError("401 no key is AuthenticationError", Anthropic.AuthenticationError, 401, "authentication_error",
    () => anthropic({ apiKey: null, defaultHeaders: { Authorization: null } }).messages.create(ask));
await check("thread refused", async () => {
    try {
        await client.beta.messages.create({ ...ask, thread: { type: "create" } });
        ok("thread refused", false, "no error");
    } catch (e) {
        noControl({ message: e.message, error: e.error }, "thread refused");
        ok("thread refused: BadRequestError with details.error_code", e instanceof Anthropic.BadRequestError
            && e.error?.error?.details?.error_code === "thread_unsupported_request", e.error);
    }
});
await expectAnthropicError("streamed 404 is NotFoundError", Anthropic.NotFoundError, 404, "not_found_error",
    () => client.messages.stream({ ...ask, model: "no-such-model" }).finalMessage());

done();
