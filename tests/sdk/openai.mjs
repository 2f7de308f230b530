// openai.mjs — the official openai package against k3c serve (docs/SERVING.md "Client compatibility"): whole and
// streamed tool calls, the SDK's tool-running loop to the final answer, the developer role, logprobs, typed errors.
import {
    openai, ok, check, noControl, done, MODEL, CALCULATOR, QUESTION, ANSWER, isCalculatorCall, expectError,
} from "./lib.mjs";

const client = openai();
const OpenAI = client.constructor;
const ask = { model: MODEL, messages: [{ role: "user", content: QUESTION }], tools: [CALCULATOR], temperature: 0 };

await check("models.list", async () => {
    const models = await client.models.list();
    noControl(models.data, "models.list");
    ok("models.list names the served model", models.data.some((m) => m.id === MODEL), models.data);
});

await check("whole tool call", async () => {
    const r = await client.chat.completions.create(ask);
    noControl(r, "whole tool call");
    const c = r.choices[0];
    ok("whole tool call: object and id", r.object === "chat.completion" && typeof r.id === "string", r);
    ok("whole tool call: finish_reason tool_calls", c.finish_reason === "tool_calls", c);
    ok("whole tool call: one calculator call",
        c.message.tool_calls?.length === 1 && isCalculatorCall(c.message.tool_calls[0]), c.message);
    ok("whole tool call: usage", r.usage?.prompt_tokens > 0 && r.usage.completion_tokens > 0
        && r.usage.total_tokens === r.usage.prompt_tokens + r.usage.completion_tokens, r.usage);
});

await check("streamed tool call", async () => {
    const stream = client.chat.completions.stream({ ...ask, stream_options: { include_usage: true } });
    let chunks = 0;
    stream.on("chunk", (ch) => {
        chunks++;
        noControl(ch, "stream chunk");
    });
    const final = await stream.finalChatCompletion();
    noControl(final, "streamed final");
    const c = final.choices[0];
    ok("streamed tool call: chunks", chunks > 1, `${chunks} chunks`);
    ok("streamed tool call: assembled calculator call",
        c.message.tool_calls?.length === 1 && isCalculatorCall(c.message.tool_calls[0]), c.message);
    ok("streamed tool call: finish_reason tool_calls", c.finish_reason === "tool_calls", c);
    ok("streamed tool call: usage chunk", final.usage?.completion_tokens > 0, final.usage);
});

await check("raw stream", async () => {
    const s = await client.chat.completions.create({ ...ask, stream: true });
    let ids = new Set(), names = [], finish = null, n = 0;
    for await (const ch of s) {
        n++;
        noControl(ch, "raw stream chunk");
        ids.add(ch.id);
        const d = ch.choices[0]?.delta;
        for (const tc of d?.tool_calls ?? []) if (tc.function?.name) names.push(tc.function.name);
        finish = ch.choices[0]?.finish_reason ?? finish;
    }
    ok("raw stream: one id, chat.completion.chunk", ids.size === 1 && n > 1, [...ids]);
    ok("raw stream: the call's name once", names.length === 1 && names[0] === "calculator", names);
    ok("raw stream: finish_reason tool_calls", finish === "tool_calls", finish);
});

for (const streamed of [false, true]) {
    const name = `runTools${streamed ? " streamed" : ""}`;
    await check(name, async () => {
        const seen = [];
        const runner = client.chat.completions.runTools({
            ...ask,
            stream: streamed,
            tools: [{
                type: "function",
                function: {
                    ...CALCULATOR.function,
                    parse: JSON.parse,
                    function: ({ expression }) => {
                        seen.push(expression);
                        const safe = expression.replace(/[^0-9+\-*/(). ]/g, "");
                        return String(Function(`"use strict"; return (${safe})`)());
                    },
                },
            }],
        });
        if (streamed) runner.on("chunk", (ch) => noControl(ch, `${name} chunk`));
        runner.on("chatCompletion", (c) => noControl(c, `${name} completion`));
        const text = await runner.finalContent();
        ok(`${name}: the tool ran`, seen.length >= 1, seen);
        ok(`${name}: final answer`, typeof text === "string" && text.includes("42"), text);
        const msgs = runner.messages;
        ok(`${name}: assistant call, tool result, answer`, msgs.some((m) => m.role === "tool" && m.content === "42")
            && msgs.at(-1)?.role === "assistant", msgs);
    });
}

await check("final answer after a tool result", async () => {
    const r = await client.chat.completions.create({
        ...ask,
        messages: [
            { role: "user", content: QUESTION },
            {
                role: "assistant",
                content: null,
                tool_calls: [{
                    id: "call_1", type: "function",
                    function: { name: "calculator", arguments: '{"expression": "6 * 7"}' },
                }],
            },
            { role: "tool", tool_call_id: "call_1", content: "42" },
        ],
    });
    noControl(r, "final answer");
    const c = r.choices[0];
    ok("final answer after a tool result: text",
        c.message.content === ANSWER && !c.message.tool_calls?.length, c.message);
    ok("final answer after a tool result: finish_reason stop", c.finish_reason === "stop", c);
});

await check("developer role", async () => {
    const r = await client.chat.completions.create({
        ...ask,
        messages: [
            { role: "developer", content: "Use the calculator for arithmetic." },
            { role: "user", content: QUESTION },
        ],
        max_completion_tokens: 40,
    });
    noControl(r, "developer role");
    ok("developer role: accepted", r.choices?.length === 1 && r.choices[0].message.role === "assistant", r);
});

await check("logprobs", async () => {
    const hello = {
        model: MODEL, messages: [{ role: "user", content: "Hello" }], logprobs: true, max_tokens: 8, seed: 1,
    };
    const r = await client.chat.completions.create({ ...hello, top_logprobs: 2 });
    noControl(r, "logprobs");
    const lp = r.choices[0].logprobs?.content;
    ok("logprobs: one entry per token", Array.isArray(lp) && lp.length === r.usage.completion_tokens, r.choices[0]);
    ok("logprobs: values, bytes and two alternatives", lp?.every((t) => t.logprob <= 0 && Array.isArray(t.bytes)
        && t.top_logprobs.length === 2 && t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob), lp);
    const s = await client.chat.completions.create({ ...hello, top_logprobs: 1, stream: true });
    let n = 0;
    for await (const ch of s) {
        noControl(ch, "logprobs chunk");
        n += ch.choices[0]?.logprobs?.content?.length ?? 0;
    }
    ok("logprobs: streamed", n === r.usage.completion_tokens, `${n} streamed, ${r.usage.completion_tokens} whole`);
});

// OpenAI's error body: {message, type, param, code} (the SDK hands over its "error" member)
const openaiBody = (b) => typeof b?.message === "string" && b.message.length > 0;
const expectOpenAIError = (name, cls, status, fn) => expectError(name, cls, status, fn, openaiBody);

await expectOpenAIError("404 unknown model is NotFoundError", OpenAI.NotFoundError, 404,
    () => client.chat.completions.create({ ...ask, model: "no-such-model" }));
await expectOpenAIError("400 bad value is BadRequestError", OpenAI.BadRequestError, 400,
    () => client.chat.completions.create({ ...ask, temperature: 7 }));
await expectOpenAIError("401 without the key is AuthenticationError", OpenAI.AuthenticationError, 401,
    () => openai({ apiKey: "wrong-key" }).chat.completions.create(ask));

done();
