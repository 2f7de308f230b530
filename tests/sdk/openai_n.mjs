// openai_n.mjs — `n` choices through the official openai package (docs/SERVING.md "Client compatibility", §3): n 2
// whole and streamed (the SDK's stream helper assembling each choice's tool call), the usage of all choices.
import { openai, ok, check, noControl, done, MODEL, CALCULATOR, QUESTION, isCalculatorCall } from "./lib.mjs";

const client = openai();
const ask = { model: MODEL, messages: [{ role: "user", content: QUESTION }], tools: [CALCULATOR], temperature: 0 };

const choicesOk = (choices) => choices?.length === 2 && choices.every((c, i) => c.index === i
    && c.finish_reason === "tool_calls" && c.message.tool_calls?.length === 1
    && isCalculatorCall(c.message.tool_calls[0]));

await check("n 2 whole", async () => {
    const one = await client.chat.completions.create(ask);
    const r = await client.chat.completions.create({ ...ask, n: 2 });
    noControl(r, "n 2 whole");
    ok("n 2 whole: two calculator calls, index 0 and 1", choicesOk(r.choices), r.choices);
    const ids = r.choices.map((c) => c.message.tool_calls?.[0]?.id);
    ok("n 2 whole: distinct call ids", ids[0] !== ids[1], ids);
    ok("n 2 whole: usage, the prompt once, both completions", r.usage?.prompt_tokens === one.usage.prompt_tokens
        && r.usage.completion_tokens === 2 * one.usage.completion_tokens
        && r.usage.total_tokens === r.usage.prompt_tokens + r.usage.completion_tokens, { n2: r.usage, n1: one.usage });
});

await check("n 2 streamed", async () => {
    const stream = client.chat.completions.stream({ ...ask, n: 2, stream_options: { include_usage: true } });
    const seen = new Set();
    stream.on("chunk", (ch) => {
        noControl(ch, "n 2 chunk");
        for (const c of ch.choices) seen.add(c.index);
    });
    const final = await stream.finalChatCompletion();
    noControl(final, "n 2 streamed final");
    ok("n 2 streamed: chunks of both choices", seen.size === 2 && seen.has(0) && seen.has(1), [...seen]);
    ok("n 2 streamed: each choice's call assembled", choicesOk(final.choices), final.choices);
    ok("n 2 streamed: usage chunk", final.usage?.completion_tokens > 0 && final.usage.prompt_tokens > 0, final.usage);
});

await check("n 2 sampled", async () => {
    const r = await client.chat.completions.create({ ...ask, n: 2, temperature: 1, seed: 5, max_tokens: 96 });
    noControl(r, "n 2 sampled");
    ok("n 2 sampled: two assistant choices", r.choices?.length === 2
        && r.choices.every((c, i) => c.index === i && c.message.role === "assistant"), r.choices);
});

done();
